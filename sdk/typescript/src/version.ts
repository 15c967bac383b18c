/** The package's version, sent in User-Agent (`quotaplane-ts/<version>`); a test holds it to package.json's. */
export const VERSION = "0.1.0";
