import { describe, expect, it } from 'vitest';
import { testSummary } from './Webhooks';
import type { WebhookTestResult } from '../api';

const base: WebhookTestResult = { event: 'webhook.test', url: 'https://hooks.example.com/qp', status_code: 204, error: null, succeeded: true, duration_ms: 1234, at: '2026-11-25T11:00:00Z' };

describe('testSummary', () => {
  it('says what the receiver did', () => {
    expect(testSummary(base)).toBe('Delivered: https://hooks.example.com/qp answered 204 in 1,234 ms.');
    expect(testSummary({ ...base, succeeded: false, status_code: 502, error: 'receiver answered 502' }))
      .toBe('Not delivered: https://hooks.example.com/qp answered 502 after 1,234 ms. A receiver must answer 2xx.');
    expect(testSummary({ ...base, succeeded: false, status_code: null, error: 'dial tcp: i/o timeout' }))
      .toBe('Not delivered: no answer from https://hooks.example.com/qp (dial tcp: i/o timeout).');
  });
  it('calls a refused private address refused, not a failure of the receiver', () => {
    expect(testSummary({ ...base, url: 'http://10.0.0.5/hook', succeeded: false, status_code: null, error: 'webhook target is not a public address: 10.0.0.5:80',
      url_warning: '10.0.0.5 is a private address: ...' })).toBe('Refused: http://10.0.0.5/hook is not a public address, so nothing was sent.');
  });
});
