-- The worker's periodic heartbeat job records here which worker last ran a job, so
-- operators can see that the job queue is alive end to end.
BEGIN;
CREATE TABLE worker_heartbeats (
    worker_id  text PRIMARY KEY,
    hostname   text NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL
);
COMMIT;
