// Password: the signed-in user changes their own password. Every session of the user
// ends, this one included; the answer is a new session, whose CSRF token replaces the
// old one here.
import { useState } from 'preact/hooks';
import { api, setCSRFToken } from '../api';
import { errorFor } from '../limits';
import { Id, type PageProps } from '../ui';

export function Password({ session }: PageProps) {
  const [current, setCurrent] = useState('');
  const [next, setNext] = useState('');
  const [again, setAgain] = useState('');
  const [error, setError] = useState<string>();
  const [done, setDone] = useState(false);
  const [busy, setBusy] = useState(false);
  return (
    <>
      <div class="page-head"><h1>Password</h1></div>
      <form class="panel" aria-labelledby="password-h" onSubmit={async (e) => {
        e.preventDefault();
        setDone(false);
        if (!current || !next) { setError('Enter your current password and a new one.'); return; }
        if (next !== again) { setError('The new password and its repetition differ.'); return; }
        setBusy(true);
        try {
          const s = await api.changePassword(current, next);
          setCSRFToken(s.csrf_token);
          setCurrent(''); setNext(''); setAgain(''); setError(undefined); setDone(true);
        } catch (err) { setError(errorFor(err, 'new_password')); }
        setBusy(false);
      }}>
        <h2 id="password-h">Change the password of <Id id={session.email} /></h2>
        <p class="muted">Your other sessions, in other browsers too, are signed out.</p>
        <div class="form-grid">
          <div class="field"><label for="current-password">Current password</label>
            <input id="current-password" type="password" autoComplete="current-password" value={current} onInput={(e) => setCurrent((e.target as HTMLInputElement).value)} /></div>
          <div class="field"><label for="new-password">New password (12 to 200 characters)</label>
            <input id="new-password" type="password" autoComplete="new-password" value={next} onInput={(e) => setNext((e.target as HTMLInputElement).value)} /></div>
          <div class="field"><label for="new-password-again">New password, again</label>
            <input id="new-password-again" type="password" autoComplete="new-password" value={again} onInput={(e) => setAgain((e.target as HTMLInputElement).value)} /></div>
        </div>
        {error && <p class="field-error" role="alert">{error}</p>}
        {done && <p role="status">Password changed; your other sessions are signed out.</p>}
        <div class="actions"><button type="submit" class="primary" disabled={busy}>{busy ? 'Changing…' : 'Change password'}</button></div>
      </form>
    </>
  );
}
