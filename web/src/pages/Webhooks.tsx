// The org's webhook: its URL, signing secret and delivery log.
import { useState } from 'preact/hooks';
import { api, type Webhook, type WebhookTestResult } from '../api';
import { formatNumber, formatTime } from '../format';
import { errorFor } from '../limits';
import { Empty, ErrorState, Loading, URLText, useLoad, usePaged } from '../ui';
import type { PageProps } from '../ui';

export function Webhooks({ session }: PageProps) {
  const org = session.org;
  const hook = useLoad(() => api.webhook(org), [org]);
  const log = usePaged((cursor) => api.webhookDeliveries(org, cursor), [org]);
  const deliveries = log.items;
  return (
    <>
      <div class="page-head"><h1>Webhooks</h1>
        <button type="button" onClick={() => { hook.reload(); log.reload(); }}>Refresh</button></div>
      {hook.loading && !hook.data && <Loading what="the webhook settings" />}
      {hook.error !== undefined && <ErrorState error={hook.error} retry={hook.reload} />}
      {hook.data && <WebhookSettings org={org} hook={hook.data} canEdit={session.role === 'admin'} onChanged={() => { hook.reload(); log.reload(); }} />}
      <h2>Recent deliveries</h2>
      {log.loading && !log.loaded && <Loading what="the delivery log" />}
      {log.error !== undefined && <ErrorState error={log.error} retry={log.reload} />}
      {log.loaded && deliveries.length === 0 && <Empty>No deliveries yet. Every attempt to send an event appears here, failed ones too.</Empty>}
      {deliveries.length > 0 && (
        <div class="table-wrap"><table data-testid="deliveries" class="deliveries">
          <thead><tr><th scope="col">Time</th><th scope="col">Event</th><th scope="col" class="num">Attempt</th><th scope="col">Result</th><th scope="col">URL</th></tr></thead>
          <tbody>{deliveries.map((d) => (
            <tr><td class="nowrap">{formatTime(d.at)}</td><td>{d.event} <span class="muted">#{d.event_id}</span></td><td class="num">{d.attempt}</td>
              <td>{d.succeeded ? <span class="badge">{d.status_code ?? 'ok'}</span> : <span class="badge revoked">{d.status_code ?? 'failed'}</span>}
                {d.error && <span class="muted small"> {d.error}</span>}</td>
              <td><URLText url={d.url} /></td></tr>
          ))}</tbody>
        </table></div>
      )}
      {log.moreError !== undefined && <ErrorState error={log.moreError} />}
      {log.hasMore && <button type="button" disabled={log.loadingMore} onClick={log.more}>Load older deliveries</button>}
    </>
  );
}

/** PRIVATE_WHY explains the refusal of a non-public webhook address. */
const PRIVATE_WHY = 'Why: Quotaplane sends webhooks only to public internet addresses, so that a webhook URL cannot make '
  + 'its servers reach services inside their own network (loopback, private and link-local addresses). '
  + 'Use a public HTTPS address; for local development, run the api and the worker with QUOTA_WEBHOOK_ALLOW_PRIVATE=true.';

function WebhookSettings({ org, hook, canEdit, onChanged }: { org: string; hook: Webhook; canEdit: boolean; onChanged: () => void }) {
  const [shown, setShown] = useState(false);
  const [copied, setCopied] = useState('');
  const [editing, setEditing] = useState(false);
  const secret = hook.signing_secret;
  return (
    <div class="panel" data-testid="webhook">
      <dl class="facts">
        <dt>URL</dt>
        <dd>
          {editing
            ? <URLForm org={org} url={hook.url ?? ''} onDone={(changed) => { setEditing(false); if (changed) onChanged(); }} />
            : <div class="secret-row">
                <span data-testid="webhook-url">{hook.url ? <code><URLText url={hook.url} /></code> : <span class="muted">No webhook URL is set: events are recorded but not sent.</span>}</span>
                {canEdit && <button type="button" class="small" onClick={() => setEditing(true)}>{hook.url ? 'Edit URL' : 'Set a URL'}</button>}
              </div>}
          {hook.url_warning && <div class="warning small" role="note" data-testid="webhook-url-warning"><p>{hook.url_warning}</p><p>{PRIVATE_WHY}</p></div>}
          {canEdit && hook.url && secret && !editing && <TestSend org={org} explained={!!hook.url_warning} />}
        </dd>
        <dt>Events</dt><dd>{hook.events.join(', ')}</dd>
        <dt>Signing secret</dt>
        <dd>{secret ? (
          <div class="secret-row">
            <code data-testid="webhook-secret" class="secret-text">{shown ? secret : '•'.repeat(16)}</code>
            <button type="button" onClick={() => setShown(!shown)} aria-pressed={shown}>{shown ? 'Hide' : 'Show'}</button>
            <button type="button" class="primary" onClick={async () => {
              try { await navigator.clipboard.writeText(secret); setCopied('Copied.'); }
              catch { setCopied('Copying is not allowed here: show the secret, select it and copy it.'); }
            }}>Copy secret</button>
            {copied && <span class="muted" aria-live="polite">{copied}</span>}
          </div>
        ) : <span class="muted" data-testid="webhook-note">{hook.note ?? 'No signing secret.'}</span>}</dd>
      </dl>
      <p class="muted small">Each delivery is a JSON POST with <code>{hook.signature_header}: t=&lt;unix&gt;,v1=&lt;hex&gt;</code>.
        To verify it, compute HMAC-SHA256 of <code>&lt;t&gt;.&lt;raw body&gt;</code> with the secret as the key, compare it
        with each <code>v1</code> (two for a day after a rotation) in constant time, and refuse an old <code>t</code>; in Go, <code>webhook.Verify</code> of
        {' '}<code><URLText url="github.com/quotaplane/quotaplane/client/webhook" /></code> does it. Failed deliveries are retried with backoff.</p>
    </div>
  );
}

/** URLForm edits the org's webhook URL in place; the API's 400 shows beside the field. */
function URLForm({ org, url, onDone }: { org: string; url: string; onDone: (changed: boolean) => void }) {
  const [value, setValue] = useState(url);
  const [error, setError] = useState<string>();
  const [busy, setBusy] = useState(false);
  const save = async (next: string) => {
    setBusy(true);
    try { await api.setWebhookURL(org, next); onDone(true); } catch (e) { setError(errorFor(e, 'webhook_url')); setBusy(false); }
  };
  return (
    <form class="inline-form url-form" noValidate onSubmit={(e) => {
      e.preventDefault();
      const v = value.trim();
      if (v !== '' && !/^https?:\/\/\S+$/.test(v)) { setError('Enter an http:// or https:// URL, or leave it empty for none.'); return; }
      void save(v);
    }}>
      <label for="webhook-url-input">Webhook URL</label>
      <input id="webhook-url-input" type="url" name="webhook_url" value={value} autoFocus placeholder="https://hooks.example.com/quotaplane"
        aria-invalid={error ? 'true' : undefined} aria-describedby={error ? 'webhook-url-error' : undefined}
        onInput={(e) => { setValue((e.target as HTMLInputElement).value); setError(undefined); }}
        onKeyDown={(e) => { if (e.key === 'Escape') onDone(false); }} />
      <button type="submit" class="primary" disabled={busy}>Save URL</button>
      {url && <button type="button" class="danger" disabled={busy} onClick={() => void save('')}>Remove URL</button>}
      <button type="button" onClick={() => onDone(false)}>Cancel</button>
      {error && <p id="webhook-url-error" class="field-error" role="alert">{error}</p>}
    </form>
  );
}

/** TestSend sends one webhook.test event now and shows what the receiver did. */
function TestSend({ org, explained }: { org: string; explained: boolean }) {
  const [busy, setBusy] = useState(false);
  const [result, setResult] = useState<WebhookTestResult>();
  const [error, setError] = useState<string>();
  return (
    <div class="test-send">
      <button type="button" class="primary" disabled={busy} onClick={async () => {
        setBusy(true); setError(undefined); setResult(undefined);
        try { setResult(await api.testWebhook(org)); } catch (e) { setError(errorFor(e, '')); }
        setBusy(false);
      }}>{busy ? 'Sending…' : 'Send a test event'}</button>
      {error && <p class="field-error" role="alert">{error}</p>}
      {result && <TestResult r={result} explained={explained} />}
    </div>
  );
}

/** testSummary says what happened to a test event, in one sentence. */
export function testSummary(r: WebhookTestResult): string {
  const took = `${formatNumber(r.duration_ms)} ms`;
  if (r.succeeded) return `Delivered: ${r.url} answered ${r.status_code} in ${took}.`;
  if (r.url_warning) return `Refused: ${r.url} is not a public address, so nothing was sent.`;
  if (r.status_code !== null) return `Not delivered: ${r.url} answered ${r.status_code} after ${took}. A receiver must answer 2xx.`;
  return `Not delivered: no answer from ${r.url} (${r.error ?? 'unknown error'}).`;
}

/** TestResult shows a test's outcome; explained: the URL's warning above already says why a private address is refused. */
function TestResult({ r, explained }: { r: WebhookTestResult; explained: boolean }) {
  return (
    <div class={`test-result ${r.succeeded ? 'ok' : 'failed'}`} role="status" data-testid="webhook-test-result">
      <p><span class={`badge ${r.succeeded ? '' : 'revoked'}`}>{r.succeeded ? 'delivered' : r.url_warning ? 'refused' : 'failed'}</span> {testSummary(r)}</p>
      {r.url_warning && !explained && <><p class="small">{r.url_warning}</p><p class="small">{PRIVATE_WHY}</p></>}
      {r.url_warning && explained && <p class="small">See the warning above: {r.url_warning.split(':')[0]}.</p>}
      {!r.succeeded && !r.url_warning && r.error && <p class="small muted">{r.error}</p>}
      <p class="small muted">Sent {formatTime(r.at)} as a <code>webhook.test</code> event (id 0), signed like every delivery; test events are not retried and not in the delivery log.</p>
    </div>
  );
}
