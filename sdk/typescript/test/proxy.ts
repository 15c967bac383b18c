// Network troubles between the client and Quotaplane, made with real sockets.
import { createServer as createHttpServer } from "node:http";
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

/** What a scripted server saw of one request. */
export interface Seen {
  at: number; // performance.now() when it arrived
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
}

/** One answer of a scripted server. */
export interface Scripted {
  status: number;
  headers?: Record<string, string>;
  body?: unknown;
}

/**
 * A small HTTP server standing for Quotaplane where a fault is needed: the n-th request
 * (from 1) is answered `answer(n)`; `seen` records each request's arrival and headers.
 */
export async function scriptedServer(answer: (n: number) => Scripted): Promise<Proxy & { seen: Seen[] }> {
  const seen: Seen[] = [];
  const sockets = new Set<Socket>();
  const srv = createHttpServer((req, res) => {
    seen.push({ at: performance.now(), method: req.method ?? "", url: req.url ?? "", headers: req.headers });
    req.resume();
    req.on("end", () => {
      const a = answer(seen.length);
      res.writeHead(a.status, { "Content-Type": "application/json", ...a.headers });
      res.end(a.body === undefined ? "" : JSON.stringify(a.body));
    });
  });
  srv.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  const p = await listen(srv as unknown as Server);
  return {
    url: `http://127.0.0.1:${p}`,
    seen,
    get connections() {
      return seen.length;
    },
    close: closer(srv as unknown as Server, sockets),
  };
}

/** The body of an allowed check, as Quotaplane answers it. */
export const allowedResult = { allowed: true, mode: "enforce", levels: [] };

/** A 503 with Retry-After, as Quotaplane answers when too many checks are in flight. */
export function busy(retryAfter: string): Scripted {
  return {
    status: 503,
    headers: { "Content-Type": "application/problem+json", "Retry-After": retryAfter },
    body: { type: "https://quotaplane.dev/problems/service-unavailable", title: "Service Unavailable", status: 503 },
  };
}
