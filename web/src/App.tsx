// The console shell: sign-in, navigation and the signed-in user's pages.
import { useEffect, useState } from 'preact/hooks';
import { api, ApiError, setCSRFToken, setOnSessionEnded, type Session } from './api';
import { Allocation } from './pages/Allocation';
import { Audit } from './pages/Audit';
import { Billing } from './pages/Billing';
import { Entitlements } from './pages/Entitlements';
import { Keys } from './pages/Keys';
import { ModeSettings } from './pages/Mode';
import { Overview } from './pages/Overview';
import { Password } from './pages/Password';
import { Webhooks } from './pages/Webhooks';
import { REPORT_PATH, ShadowReport } from './pages/ShadowReport';
import { ErrorState, Loading } from './ui';

const PAGES = [
  { path: '', title: 'Overview', Page: Overview },
  { path: 'allocation', title: 'Allocation', Page: Allocation },
  { path: 'keys', title: 'API keys', Page: Keys },
  { path: 'audit', title: 'Audit log', Page: Audit },
  { path: 'billing', title: 'Billing export', Page: Billing },
  { path: 'entitlements', title: 'Entitlements', Page: Entitlements, inNav: false }, // linked from the overview's plan card
  { path: 'webhooks', title: 'Webhooks', Page: Webhooks },
  { path: 'settings', title: 'Mode', Page: ModeSettings },
  { path: REPORT_PATH, title: 'Shadow and warn report', Page: ShadowReport, inNav: false }, // linked from Mode
  { path: 'password', title: 'Password', Page: Password, inNav: false }, // linked beside Sign out
];

const BASE = '/console/';
function currentPath(): string {
  const p = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : '';
  return p.replace(/\/$/, '');
}

export function App() {
  const [session, setSession] = useState<Session | null | undefined>(undefined);
  const [error, setError] = useState<unknown>();
  const [path, setPath] = useState(currentPath());

  const load = () => {
    setError(undefined);
    api.session().then((s) => {
      if (s) setCSRFToken(s.csrf_token);
      setSession(s ?? null);
    }, (e) => (e instanceof ApiError && e.status === 401 ? setSession(null) : setError(e)));
  };
  useEffect(() => {
    setOnSessionEnded(() => setSession(null));
    load();
    const onPop = () => setPath(currentPath());
    window.addEventListener('popstate', onPop);
    return () => window.removeEventListener('popstate', onPop);
  }, []);

  const page = PAGES.find((p) => p.path === path) ?? PAGES[0];
  // Signed out, every path shows the sign-in form, and the tab says so.
  const title = session === null ? 'Sign in' : page.title;
  useEffect(() => { document.title = `${title} · Quotaplane console`; }, [title]);

  if (error !== undefined) return <main class="center"><ErrorState error={error} retry={load} /></main>;
  if (session === undefined) return <main class="center"><Loading what="the console" /></main>;
  if (session === null) return <SignIn onSignedIn={(s) => { setCSRFToken(s.csrf_token); setSession(s); }} />;

  const go = (p: string) => (e: MouseEvent) => {
    if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    history.pushState(null, '', BASE + p);
    setPath(p);
    document.getElementById('main')?.focus();
  };
  return (
    <>
      <a class="skip" href="#main">Skip to content</a>
      <header class="top">
        <div class="brand">Quotaplane <span class="muted">console</span></div>
        <nav aria-label="Console">
          {PAGES.filter((p) => !('inNav' in p)).map((p) => (
            <a href={BASE + p.path} onClick={go(p.path)} aria-current={p === page ? 'page' : undefined}>{p.title}</a>
          ))}
        </nav>
        <div class="who">
          <span data-testid="who" title={session.email}>{session.email}</span> <span class={`badge role-${session.role}`} data-testid="role">{session.role}</span>
          <a href={BASE + 'password'} onClick={go('password')} aria-current={page.path === 'password' ? 'page' : undefined}>Password</a>
          <button type="button" onClick={async () => {
            try { await api.signOut(); } catch { /* the session is gone either way */ }
            setSession(null);
          }}>Sign out</button>
        </div>
      </header>
      {session.role === 'viewer' && <p class="viewer-note" role="note">You have read-only access to {session.org}.</p>}
      <main id="main" tabIndex={-1}>
        <page.Page session={session} />
      </main>
    </>
  );
}

// orgKey keeps, in this browser, the organization last signed in to.
const orgKey = 'quotaplane.console.org';

// initialOrg is the organization the sign-in form starts with: ?org= of the address
// (make run prints the console's URL with ?org=demo), else the one this browser
// signed in to last.
export function initialOrg(): string {
  const fromURL = new URLSearchParams(location.search).get('org');
  if (fromURL) return fromURL.trim();
  try { return localStorage.getItem(orgKey) ?? ''; } catch { return ''; }
}

function SignIn({ onSignedIn }: { onSignedIn: (s: Session) => void }) {
  // Console emails are unique per organization, not across them: the sign-in names
  // the organization, so it never reveals whether an email exists in another one.
  const [org, setOrg] = useState(initialOrg);
  const [email, setEmail] = useState('');
  const [password, setPassword] = useState('');
  const [error, setError] = useState<string>();
  const [busy, setBusy] = useState(false);
  return (
    <main class="center">
      <form class="panel sign-in" aria-labelledby="sign-in-h" onSubmit={async (e) => {
        e.preventDefault();
        if (!org.trim() || !email.trim() || !password) { setError('Enter your organization, email and password.'); return; }
        setBusy(true);
        try {
          const s = await api.signIn(org.trim(), email.trim(), password);
          try { localStorage.setItem(orgKey, s.org); } catch { /* private mode: not remembered */ }
          onSignedIn(s);
        }
        catch (err) { setError(err instanceof Error ? err.message : String(err)); setBusy(false); }
      }}>
        <h1 id="sign-in-h">Sign in to Quotaplane</h1>
        <div class="field"><label for="org">Organization</label>
          <input id="org" type="text" autoComplete="organization" spellcheck={false} value={org} autoFocus={!org} onInput={(e) => setOrg((e.target as HTMLInputElement).value)} /></div>
        <div class="field"><label for="email">Email</label>
          <input id="email" type="email" autoComplete="username" value={email} autoFocus={!!org} onInput={(e) => setEmail((e.target as HTMLInputElement).value)} /></div>
        <div class="field"><label for="password">Password</label>
          <input id="password" type="password" autoComplete="current-password" value={password} onInput={(e) => setPassword((e.target as HTMLInputElement).value)} /></div>
        {error && <p class="field-error" role="alert">{error}</p>}
        <button type="submit" class="primary" disabled={busy}>{busy ? 'Signing in…' : 'Sign in'}</button>
      </form>
    </main>
  );
}
