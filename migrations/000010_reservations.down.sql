BEGIN;
DROP TABLE reservations;
COMMIT;
