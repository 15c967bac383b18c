// Network troubles between the client and Quotaplane, made with real sockets.
import { createServer, connect, type Server, type Socket } from "node:net";

export interface Proxy {
  readonly url: string;
  /** Connections accepted so far. */
  readonly connections: number;
  close(): Promise<void>;
}

function listen(srv: Server): Promise<number> {
  return new Promise((resolve, reject) => {
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const a = srv.address();
      if (a === null || typeof a === "string") return reject(new Error("no address"));
      resolve(a.port);
    });
  });
}

function closer(srv: Server, sockets: Set<Socket>): () => Promise<void> {
  return () =>
    new Promise((resolve) => {
      for (const s of sockets) s.destroy();
      srv.close(() => resolve());
    });
}

/**
 * A TCP proxy to `target` (host:port) that loses the reply of its first `drop`
 * connections: the request reaches Quotaplane whole and is decided, but the
 * connection is cut as the answer starts to come back, as a network failure would.
 */
export async function lossyProxy(target: string, drop = 1): Promise<Proxy> {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const sockets = new Set<Socket>();
  let connections = 0;
  const srv = createServer((client) => {
    const n = ++connections;
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    const upstream = connect(port, host);
    sockets.add(upstream);
    upstream.on("close", () => sockets.delete(upstream));
    client.pipe(upstream);
    if (n <= drop) {
      upstream.once("data", () => {
        upstream.destroy();
        client.destroy();
      });
    } else {
      upstream.pipe(client);
    }
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
  });
  const p = await listen(srv);
  return {
    url: `http://127.0.0.1:${p}`,
    get connections() {
      return connections;
    },
    close: closer(srv, sockets),
  };
}

/** A server that accepts connections and never answers: a Quotaplane that hangs. */
export async function silentServer(): Promise<Proxy> {
  const sockets = new Set<Socket>();
  let connections = 0;
  const srv = createServer((s) => {
    connections++;
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
    s.on("error", () => {});
  });
  const p = await listen(srv);
  return {
    url: `http://127.0.0.1:${p}`,
    get connections() {
      return connections;
    },
    close: closer(srv, sockets),
  };
}
