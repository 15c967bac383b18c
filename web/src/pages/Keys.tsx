// API keys: create (the secret shown once), list and revoke.
import { useState } from 'preact/hooks';
import { api, type APIKey, type NewKey, type Scope } from '../api';
import { formatTime } from '../format';
import { errorFor } from '../limits';
import { Confirm, Empty, ErrorState, IdText, Loading, useLoad } from '../ui';
import type { PageProps } from '../ui';

const ALL_SCOPES: Scope[] = ['check', 'admin', 'billing'];

export function Keys({ session }: PageProps) {
  const org = session.org;
  const canEdit = session.role === 'admin';
  const keys = useLoad(() => api.keys(org).then((p) => p.items), [org]);
  const [name, setName] = useState('');
  const [scopes, setScopes] = useState<Scope[]>(['check']);
  const [created, setCreated] = useState<NewKey>();
  const [error, setError] = useState<string>();
  const [revoke, setRevoke] = useState<APIKey>();
  const [copied, setCopied] = useState('');
  return (
    <>
      <div class="page-head"><h1>API keys</h1></div>
      {canEdit && (
        <form class="panel" aria-labelledby="new-key-h" onSubmit={async (e) => {
          e.preventDefault();
          if (!name.trim()) { setError('Enter a name for the key.'); return; }
          if (scopes.length === 0) { setError('Pick at least one scope.'); return; }
          try { setCreated(await api.createKey(org, name.trim(), scopes)); setName(''); setError(undefined); setCopied(''); keys.reload(); }
          catch (err) { setError(errorFor(err, 'name')); }
        }}>
          <h2 id="new-key-h">Create a key</h2>
          <div class="form-grid">
            <div class="field"><label for="key-name">Name</label>
              <input id="key-name" value={name} placeholder="e.g. checkout-service" onInput={(e) => setName((e.target as HTMLInputElement).value)} /></div>
            <fieldset class="field"><legend>Scopes</legend>
              {ALL_SCOPES.map((s) => (
                <label class="check"><input type="checkbox" name="scope" value={s} checked={scopes.includes(s)}
                  onChange={(e) => setScopes((e.target as HTMLInputElement).checked ? [...scopes, s] : scopes.filter((x) => x !== s))} /> {s}</label>
              ))}
            </fieldset>
          </div>
          {error && <p class="field-error" role="alert">{error}</p>}
          <div class="actions"><button type="submit" class="primary">Create key</button></div>
        </form>
      )}
      {created && (
        <div class="panel secret" role="status" data-testid="new-key">
          <h2>Key “<IdText text={created.name} />” created</h2>
          <p>Copy the secret now: it is shown only once.</p>
          <div class="secret-row">
            <code data-testid="key-secret">{created.secret}</code>
            <button type="button" class="primary" onClick={async () => {
              try { await navigator.clipboard.writeText(created.secret); setCopied('Copied.'); }
              catch { setCopied('Copying is not allowed here: select the secret and copy it.'); }
            }}>Copy</button>
            <button type="button" onClick={() => setCreated(undefined)}>Done</button>
          </div>
          {copied && <p class="muted" aria-live="polite">{copied}</p>}
        </div>
      )}
      {keys.loading && !keys.data && <Loading what="keys" />}
      {keys.error !== undefined && <ErrorState error={keys.error} retry={keys.reload} />}
      {keys.data && keys.data.length === 0 && <Empty>No keys yet.</Empty>}
      {keys.data && keys.data.length > 0 && (
        <div class="table-wrap"><table data-testid="keys">
          <thead><tr><th scope="col">Name</th><th scope="col">Prefix</th><th scope="col">Scopes</th><th scope="col">Created</th><th scope="col">Last used</th><th scope="col">Status</th>{canEdit && <th scope="col"><span class="sr-only">Actions</span></th>}</tr></thead>
          <tbody>{keys.data.map((k) => (
            <tr><td><IdText text={k.name} /></td><td><code>{k.prefix}</code></td><td>{k.scopes.join(', ')}</td><td>{formatTime(k.created_at)}</td><td>{formatTime(k.last_used_at)}</td>
              <td>{k.revoked_at ? <span class="badge revoked">revoked</span> : <span class="badge">active</span>}</td>
              {canEdit && <td>{!k.revoked_at && <button type="button" class="danger small" onClick={() => setRevoke(k)}>Revoke</button>}</td>}</tr>
          ))}</tbody>
        </table></div>
      )}
      {revoke && <Confirm title={`Revoke key “${revoke.name}”?`} danger confirmLabel="Revoke key"
        body={<p>Services using it get 401 at once. This cannot be undone.</p>}
        onConfirm={async () => { await api.revokeKey(org, revoke.id); keys.reload(); }} onClose={() => setRevoke(undefined)} />}
    </>
  );
}
