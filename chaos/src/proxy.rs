//! A user-space TCP fault proxy for component links (there is no `tc netem`
//! here). It forwards one listening address to one upstream and applies
//! faults, changeable while connections are live: added latency with jitter
//! (order preserved), a stall of either direction or both (a partition:
//! bytes wait, as in a real network, until it heals), a bandwidth cap, and
//! cutting every open connection.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The faults in force.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    pub latency: Duration,
    /// Each chunk is delayed by latency plus up to this much more.
    pub jitter: Duration,
    /// Client → upstream bytes wait.
    pub stall_to_upstream: bool,
    /// Upstream → client bytes wait.
    pub stall_from_upstream: bool,
    /// Bytes per second in each direction; None = unlimited.
    pub bandwidth: Option<u64>,
    /// Bumped by [`FaultProxy::cut`]: connections opened before end.
    generation: u64,
}

#[derive(Clone, Copy, Debug)]
enum Way {
    ToUpstream,
    FromUpstream,
}

pub struct FaultProxy {
    addr: SocketAddr,
    faults: watch::Sender<Faults>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `listen` (port 0 picks one) and forwards to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (faults, watcher) = watch::channel(Faults::default());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watcher = watcher.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    connect(client, server, watcher).await;
                });
            }
        });
        Ok(Self { addr, faults, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn faults(&self) -> Faults {
        self.faults.borrow().clone()
    }

    pub fn set_latency(&self, latency: Duration, jitter: Duration) {
        self.faults.send_modify(|f| {
            f.latency = latency;
            f.jitter = jitter;
        });
    }

    /// Stalls one direction or both; [`FaultProxy::heal`] releases them.
    pub fn partition(&self, to_upstream: bool, from_upstream: bool) {
        self.faults.send_modify(|f| {
            f.stall_to_upstream = to_upstream;
            f.stall_from_upstream = from_upstream;
        });
    }

    pub fn heal(&self) {
        self.partition(false, false);
    }

    pub fn set_bandwidth(&self, bytes_per_sec: Option<u64>) {
        self.faults.send_modify(|f| f.bandwidth = bytes_per_sec);
    }

    /// Closes every connection open now; new ones are accepted.
    pub fn cut(&self) {
        self.faults.send_modify(|f| f.generation += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connect(client: TcpStream, server: TcpStream, faults: watch::Receiver<Faults>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let generation = faults.borrow().generation;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, faults.clone(), Way::ToUpstream);
    let down = pump(server_read, client_write, faults.clone(), Way::FromUpstream);
    let mut watcher = faults;
    let cut = async move {
        while watcher.borrow().generation == generation {
            if watcher.changed().await.is_err() {
                return;
            }
        }
    };
    // Either side closing, or a cut, ends the connection: dropping the
    // pumps closes both sockets.
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut => {}
    }
}

/// Chunks one direction holds at most (16 KiB each) before it stops
/// reading: the sender then waits, as on a congested link.
const HELD_CHUNKS: usize = 1024;

impl Faults {
    fn stalled(&self, way: Way) -> bool {
        match way {
            Way::ToUpstream => self.stall_to_upstream,
            Way::FromUpstream => self.stall_from_upstream,
        }
    }

    /// Whether bytes going `way` pass untouched: no latency, stall or cap.
    fn clean(&self, way: Way) -> bool {
        self.latency.is_zero()
            && self.jitter.is_zero()
            && !self.stalled(way)
            && self.bandwidth.is_none_or(|b| b == 0)
    }
}

/// Copies one direction. With no fault in force and nothing held, a
/// chunk is written as soon as it is read; otherwise it is stamped with
/// when it may be delivered and held until then (and while stalled),
/// reading on meanwhile, so order is kept whatever the faults do.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut faults: watch::Receiver<Faults>,
    way: Way,
) {
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut last = Instant::now();
    loop {
        let front = held.front().map(|(at, _)| *at);
        let full = held.len() >= HELD_CHUNKS;
        let read = async {
            if full {
                std::future::pending().await
            } else {
                from.read(&mut buf).await
            }
        };
        tokio::select! {
            n = read => {
                let n = match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let f = faults.borrow().clone();
                if held.is_empty() && f.clean(way) {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    continue;
                }
                let jitter = if f.jitter.is_zero() {
                    Duration::ZERO
                } else {
                    rand::rng().random_range(Duration::ZERO..f.jitter)
                };
                // Never before an earlier chunk: order is kept.
                last = last.max(Instant::now() + f.latency + jitter);
                held.push_back((last, buf[..n].to_vec()));
            }
            due = due(front, &mut faults, way) => {
                if !due {
                    return;
                }
                let Some((_, chunk)) = held.pop_front() else { continue };
                let bandwidth = faults.borrow().bandwidth.filter(|b| *b > 0);
                if let Some(bps) = bandwidth {
                    let pause = Duration::from_secs_f64(chunk.len() as f64 / bps as f64);
                    tokio::time::sleep(pause).await;
                }
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Waits until the held chunk stamped `at` may go: its time has come and
/// its direction is not stalled (never, with nothing held). False when
/// the faults' sender is gone.
async fn due(at: Option<Instant>, faults: &mut watch::Receiver<Faults>, way: Way) -> bool {
    let Some(at) = at else {
        return std::future::pending().await;
    };
    // A timer rounds up to the next millisecond: a chunk already due goes
    // at once.
    if at > Instant::now() {
        tokio::time::sleep_until(at).await;
    }
    loop {
        let stalled = faults.borrow_and_update().stalled(way);
        if !stalled {
            return true;
        }
        if faults.changed().await.is_err() {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// A proxy in front of an echo server, and a client connected to it.
    async fn proxied_echo() -> (FaultProxy, TcpStream) {
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo_server().await)
            .await
            .unwrap();
        let client = TcpStream::connect(proxy.addr()).await.unwrap();
        (proxy, client)
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8], wait: Duration) -> Option<Duration> {
        let started = Instant::now();
        s.write_all(msg).await.ok()?;
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(wait, s.read_exact(&mut got))
            .await
            .ok()?
            .ok()?;
        assert_eq!(got, msg);
        Some(started.elapsed())
    }

    #[tokio::test]
    async fn latency_applies_both_ways_and_keeps_order() {
        let (proxy, mut s) = proxied_echo().await;
        let fast = round_trip(&mut s, b"ping", Duration::from_secs(5))
            .await
            .unwrap();
        proxy.set_latency(Duration::from_millis(40), Duration::from_millis(20));
        let slow = round_trip(&mut s, b"ping", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(slow >= Duration::from_millis(80), "{fast:?} then {slow:?}");
        // Many small writes with jitter still arrive in order.
        let msg: Vec<u8> = (0..200u8).collect();
        for chunk in msg.chunks(10) {
            s.write_all(chunk).await.unwrap();
        }
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, msg);
    }

    #[tokio::test]
    async fn bytes_held_by_a_lifted_fault_still_go_before_newer_ones() {
        let (proxy, mut s) = proxied_echo().await;
        round_trip(&mut s, b"hi", Duration::from_secs(5))
            .await
            .unwrap();
        proxy.set_latency(Duration::from_millis(200), Duration::ZERO);
        s.write_all(b"first-").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Clean again while "first-" is held: "second" must wait for it.
        proxy.set_latency(Duration::ZERO, Duration::ZERO);
        s.write_all(b"second").await.unwrap();
        let mut got = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"first-second");
    }

    #[tokio::test]
    async fn a_partition_stalls_until_healed() {
        let (proxy, mut s) = proxied_echo().await;
        proxy.partition(false, true);
        assert!(
            round_trip(&mut s, b"lost?", Duration::from_millis(300))
                .await
                .is_none()
        );
        proxy.heal();
        // The stalled reply arrives once healed.
        let mut got = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"lost?");
    }

    #[tokio::test]
    async fn a_cut_closes_open_connections_and_new_ones_work() {
        let (proxy, mut s) = proxied_echo().await;
        round_trip(&mut s, b"hi", Duration::from_secs(5))
            .await
            .unwrap();
        proxy.cut();
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "the idle connection is closed at once"
        );
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut fresh, b"again", Duration::from_secs(5))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn bandwidth_caps_throughput() {
        let (proxy, mut s) = proxied_echo().await;
        proxy.set_bandwidth(Some(100_000));
        let took = round_trip(&mut s, &vec![7u8; 20_000], Duration::from_secs(10))
            .await
            .unwrap();
        // 20 kB each way at 100 kB/s.
        assert!(took >= Duration::from_millis(350), "{took:?}");
    }
}
