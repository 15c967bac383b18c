import { describe, expect, it } from 'vitest';

// The console's sources as text, and the paths of the client module's Go files (the
// glob's keys: nothing outside web/ is loaded).
const sources = import.meta.glob(['./**/*.tsx', './**/*.ts', '!./**/*.test.*'], { query: '?raw', import: 'default', eager: true }) as Record<string, string>;
const clientGo = import.meta.glob('../../client/**/*.go');

describe('Go import paths the console names', () => {
  it('are packages of the client module (github.com/quotaplane/quotaplane/client/...), which exist', () => {
    const named = new Set<string>();
    for (const text of Object.values(sources)) {
      for (const m of text.matchAll(/github\.com\/quotaplane\/quotaplane(\/[a-z0-9/_-]+)?/g)) named.add(m[0]);
    }
    expect(named.size).toBeGreaterThan(0); // the webhook page names the verifier
    const packages = new Set(Object.keys(clientGo).filter((f) => !f.endsWith('_test.go')).map((f) => 'github.com/quotaplane/quotaplane/' + f.replace(/^(\.\.\/)+/, '').replace(/\/[^/]+\.go$/, '')));
    for (const path of named) expect(packages, `the console names ${path}`).toContain(path);
    expect([...named]).toContain('github.com/quotaplane/quotaplane/client/webhook');
  });
});
