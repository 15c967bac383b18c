// The audit log, newest first, one page at a time.
import { api } from '../api';
import { formatTime } from '../format';
import { Empty, ErrorState, Id, Loading, usePaged } from '../ui';
import type { PageProps } from '../ui';

export function Audit({ session }: PageProps) {
  const org = session.org;
  const log = usePaged((cursor) => api.audit(org, cursor), [org]);
  if (log.loading && !log.loaded) return <Loading what="the audit log" />;
  if (log.error) return <ErrorState error={log.error} retry={log.reload} />;
  return (
    <>
      <div class="page-head"><h1>Audit log</h1><button type="button" onClick={log.reload}>Refresh</button></div>
      {log.items.length === 0 && <Empty>No changes recorded yet.</Empty>}
      {log.items.length > 0 && (
        <div class="table-wrap"><table data-testid="audit">
          <thead><tr><th scope="col">Time</th><th scope="col">Actor</th><th scope="col">Action</th><th scope="col">Object</th><th scope="col">Change</th></tr></thead>
          <tbody>{log.items.map((e) => (
            <tr><td>{formatTime(e.time)}</td><td><Id id={e.actor} /></td><td class="nowrap">{e.action}</td><td><Id id={e.object} /></td>
              <td><details><summary>before / after</summary><pre class="json">{JSON.stringify({ before: e.before, after: e.after }, null, 2)}</pre></details></td></tr>
          ))}</tbody>
        </table></div>
      )}
      {log.moreError !== undefined && <ErrorState error={log.moreError} />}
      {log.hasMore && <button type="button" disabled={log.loadingMore} onClick={log.more}>Load older changes</button>}
    </>
  );
}
