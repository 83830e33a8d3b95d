//! A TCP proxy that adds latency, for benchmarks: what `tc qdisc add dev lo root netem
//! delay D` does, on machines whose kernel has no netem.
//!
//!     cargo run --release --example delayproxy -- LISTEN_PORT UPSTREAM_PORT DELAY_MS [STATS] [--mbit RATE]
//!
//! Every connection to 127.0.0.1:LISTEN_PORT is joined to 127.0.0.1:UPSTREAM_PORT; every
//! chunk of bytes, in each direction, is delivered DELAY_MS after it arrived (connection
//! set-up too), so a request and its answer take 2 × DELAY_MS more, as with netem on
//! loopback. Bandwidth is not limited unless `--mbit RATE` (megabits per second) is
//! given: then each direction is one link of that rate shared by every connection (as a
//! node's uplink is), a chunk sent once the link has sent what came before it, then
//! delivered DELAY_MS later (`netem delay D rate R`). With STATS (a file path), it keeps
//! "CONNECTIONS BYTES_TO_SERVER BYTES_TO_CLIENT" written there (every 50 ms), so a
//! benchmark counts what each system fetched. Runs until killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One direction's link of a limited rate: when it is next free.
struct Link {
    /// Nanoseconds a byte takes.
    ns_per_byte: f64,
    free_at: std::sync::Mutex<Instant>,
}

impl Link {
    /// When a chunk of `n` bytes that arrived now has been sent.
    fn send(&self, n: usize) -> Instant {
        let now = Instant::now();
        let mut free = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let start = (*free).max(now);
        *free = start + Duration::from_nanos((n as f64 * self.ns_per_byte) as u64);
        *free
    }
}

/// Copy `from` to `to`, each chunk `delay` after it was read (and, with a `link`, after
/// the link has sent it).
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    count: Arc<AtomicU64>,
    link: Option<Arc<Link>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    count.fetch_add(n as u64, Relaxed);
                    let sent = link.as_ref().map_or_else(Instant::now, |l| l.send(n));
                    if tx.send((sent + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    while let Some((at, chunk)) = rx.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            break;
        }
    }
    tokio::time::sleep(delay).await;
    let _ = to.shutdown().await;
    reader.abort();
}

/// Connections, bytes to the server, bytes to the client.
type Counters = Arc<[Arc<AtomicU64>; 3]>;

/// The two directions' links (to the server, to the client), when the rate is limited.
type Links = Option<(Arc<Link>, Arc<Link>)>;

async fn serve(client: TcpStream, upstream: u16, delay: Duration, c: Counters, links: Links) {
    c[0].fetch_add(1, Relaxed);
    // The handshake's round trip.
    tokio::time::sleep(delay * 2).await;
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let (to_server, to_client) = match links {
        Some((a, b)) => (Some(a), Some(b)),
        None => (None, None),
    };
    let up = tokio::spawn(delayed(cr, sw, delay, c[1].clone(), to_server));
    delayed(sr, cw, delay, c[2].clone(), to_client).await;
    let _ = up.await;
}

fn main() -> std::io::Result<()> {
    let mut args: Vec<String> = std::env::args().collect();
    let mbit = match args.iter().position(|a| a == "--mbit") {
        Some(i) if i + 1 < args.len() => {
            let rate = args.remove(i + 1);
            args.remove(i);
            Some(rate.parse::<f64>().unwrap_or_else(|_| {
                eprintln!("--mbit: not a number: {rate}");
                std::process::exit(2)
            }))
        }
        _ => None,
    };
    if args.len() != 4 && args.len() != 5 {
        eprintln!("usage: delayproxy LISTEN_PORT UPSTREAM_PORT DELAY_MS [STATS] [--mbit RATE]");
        std::process::exit(2);
    }
    let link = |rate: f64| {
        Arc::new(Link {
            ns_per_byte: 8e3 / rate,
            free_at: std::sync::Mutex::new(Instant::now()),
        })
    };
    let links: Links = mbit.map(|r| (link(r), link(r)));
    let parse = |s: &str| -> u64 {
        s.parse().unwrap_or_else(|_| {
            eprintln!("not a number: {s}");
            std::process::exit(2)
        })
    };
    let (listen, upstream, ms) = (parse(&args[1]), parse(&args[2]), parse(&args[3]));
    let delay = Duration::from_millis(ms);
    let stats = args.get(4).cloned();
    let counters: Counters = Arc::new(std::array::from_fn(|_| Arc::new(AtomicU64::new(0))));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async move {
            let l = TcpListener::bind(("127.0.0.1", listen as u16)).await?;
            if let Some(path) = stats {
                let c = counters.clone();
                tokio::spawn(async move {
                    loop {
                        let line = format!(
                            "{} {} {}\n",
                            c[0].load(Relaxed),
                            c[1].load(Relaxed),
                            c[2].load(Relaxed)
                        );
                        let tmp = format!("{path}.tmp");
                        if std::fs::write(&tmp, line).is_ok() {
                            let _ = std::fs::rename(&tmp, &path);
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                });
            }
            loop {
                let (c, _) = l.accept().await?;
                tokio::spawn(serve(
                    c,
                    upstream as u16,
                    delay,
                    counters.clone(),
                    links.clone(),
                ));
            }
        })
}
