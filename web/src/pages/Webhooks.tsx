// The org's webhook: its URL, signing secret and delivery log.
import { useState } from 'preact/hooks';
import { api, type Webhook } from '../api';
import { formatTime } from '../format';
import { Empty, ErrorState, Loading, useLoad, usePaged } from '../ui';
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
      {hook.data && <WebhookSettings hook={hook.data} />}
      <h2>Recent deliveries</h2>
      {log.loading && !log.loaded && <Loading what="the delivery log" />}
      {log.error !== undefined && <ErrorState error={log.error} retry={log.reload} />}
      {log.loaded && deliveries.length === 0 && <Empty>No deliveries yet. Every attempt to send an event appears here, failed ones too.</Empty>}
      {deliveries.length > 0 && (
        <div class="table-wrap"><table data-testid="deliveries">
          <thead><tr><th scope="col">Time</th><th scope="col">Event</th><th scope="col" class="num">Attempt</th><th scope="col">Result</th><th scope="col">URL</th></tr></thead>
          <tbody>{deliveries.map((d) => (
            <tr><td>{formatTime(d.at)}</td><td>{d.event} <span class="muted">#{d.event_id}</span></td><td class="num">{d.attempt}</td>
              <td>{d.succeeded ? <span class="badge">{d.status_code ?? 'ok'}</span> : <span class="badge revoked">{d.status_code ?? 'failed'}</span>}
                {d.error && <span class="muted small"> {d.error}</span>}</td>
              <td class="break">{d.url}</td></tr>
          ))}</tbody>
        </table></div>
      )}
      {log.moreError !== undefined && <ErrorState error={log.moreError} />}
      {log.hasMore && <button type="button" disabled={log.loadingMore} onClick={log.more}>Load older deliveries</button>}
    </>
  );
}

function WebhookSettings({ hook }: { hook: Webhook }) {
  const [shown, setShown] = useState(false);
  const [copied, setCopied] = useState('');
  const secret = hook.signing_secret;
  return (
    <div class="panel" data-testid="webhook">
      <dl class="facts">
        <dt>URL</dt>
        <dd data-testid="webhook-url">{hook.url ? <code class="break">{hook.url}</code> : <span class="muted">No webhook URL is set: events are recorded but not sent.</span>}
          {hook.url_warning && <p class="warning small" role="note" data-testid="webhook-url-warning">{hook.url_warning}</p>}</dd>
        <dt>Events</dt><dd>{hook.events.join(', ')}</dd>
        <dt>Signing secret</dt>
        <dd>{secret ? (
          <div class="secret-row">
            <code data-testid="webhook-secret" class="break">{shown ? secret : '•'.repeat(16)}</code>
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
        with <code>v1</code> in constant time, and refuse an old <code>t</code>; in Go, <code>webhook.Verify</code> of
        {' '}<code>github.com/quotaplane/quotaplane/webhook</code> does it. Failed deliveries are retried with backoff.</p>
    </div>
  );
}
