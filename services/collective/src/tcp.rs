//! The CPU backend: ranks over TCP, rank 0 the hub.
//!
//! Frames are `[tag: u8][length: u64 LE][payload]`. A rank joins by connecting to rank 0 and
//! sending `HELLO` with its rank, the world size it expects, the pool's epoch and a proof that
//! it knows the pool's secret (when the pool has one, [`PoolKey`]); rank 0 accepts until every
//! rank arrived or the start-up timeout passed (its error lists the ranks that never came). A
//! hello that does not fit (another epoch: a rank of an earlier incarnation of the pool; a
//! wrong secret; a rank taken twice) is refused (its connection closed) and the wait goes on.
//! Once every rank is in, rank 0 sends each a `WELCOME`: a joining rank waits for it, within
//! the start-up timeout, before its first collective. Rank 0 only accepts once its own shard
//! is loaded, so ranks that finish loading far apart still form, as long as the start-up
//! timeout allows (not the much shorter collective timeout).
//!
//! The links are plaintext TCP: the collective port belongs on a private network. The epoch
//! and the secret keep strays and stale ranks out; they do not make it a public endpoint.
//!
//! An all-reduce costs rank 0 `2 (N-1)` transfers of the buffer; for the pools a CPU runs (a
//! few ranks on one host) the hub is not the limit, and it makes the sum's order the same for
//! every N, which a ring would not.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::{Collective, CollectiveError};

const HELLO: u8 = 1;
const DATA: u8 = 2;
const WELCOME: u8 = 3;
/// rank u32, world u32, epoch u64, proof [u8; 32].
const HELLO_BYTES: usize = 48;

/// What makes a rank a member of one incarnation of a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolKey {
    pub world: usize,
    /// Changes with every start of rank 0 (see the placement record).
    pub epoch: u64,
    /// A secret every rank of the pool was given (none: empty); a rank proves it knows it.
    pub secret: Vec<u8>,
}

impl PoolKey {
    /// What a rank sends to prove it knows the secret: SHA-256 of the secret and the epoch
    /// (all zeros without a secret). Tied to the epoch, so a proof seen once does not let a
    /// stray into a later incarnation of the pool.
    fn proof(&self) -> [u8; 32] {
        if self.secret.is_empty() {
            return [0; 32];
        }
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"ferrite collective v1\0");
        h.update(self.epoch.to_le_bytes());
        h.update(&self.secret);
        h.finalize().into()
    }
}

/// How long a joining rank tries to reach rank 0, and waits for its welcome once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinLimits {
    /// Connecting (rank 0 may not be listening yet).
    pub connect: Duration,
    /// From the hello to rank 0's welcome (rank 0 may still be loading its shard).
    pub welcome: Duration,
    /// Each collective afterwards.
    pub collective: Duration,
}

impl JoinLimits {
    /// All of forming within `start`, each collective within `collective`.
    pub fn new(start: Duration, collective: Duration) -> Self {
        Self {
            connect: start,
            welcome: start,
            collective,
        }
    }
}
/// Bounds a frame so a garbled length cannot ask for all memory.
const MAX_FRAME_BYTES: u64 = 1 << 34;

/// One rank's side of a pool over TCP.
#[derive(Debug)]
pub struct TcpCollective {
    rank: usize,
    world: usize,
    /// On rank 0: the other ranks' connections, at `rank - 1`. Elsewhere: the one to rank 0.
    links: Vec<TcpStream>,
    timeout: Duration,
    scratch: Vec<u8>,
}

fn io(
    rank: usize,
    what: &'static str,
    timeout: Duration,
) -> impl Fn(std::io::Error) -> CollectiveError {
    move |source| match source.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => CollectiveError::Timeout {
            rank,
            what,
            timeout,
        },
        ErrorKind::UnexpectedEof => CollectiveError::Io {
            rank,
            what: "connection closed (the rank is gone)",
            source,
        },
        _ => CollectiveError::Io { rank, what, source },
    }
}

fn configure(s: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))
}

fn write_frame(s: &mut TcpStream, tag: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = tag;
    head[1..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    s.write_all(&head)?;
    s.write_all(payload)
}

/// Reads one frame of `tag` into `buf`; its length must be `expect` when given.
fn read_frame(
    s: &mut TcpStream,
    tag: u8,
    expect: Option<usize>,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let len = u64::from_le_bytes(head[1..].try_into().unwrap_or_default());
    let bad = |m: String| std::io::Error::new(ErrorKind::InvalidData, m);
    if head[0] != tag || len > MAX_FRAME_BYTES || expect.is_some_and(|e| e as u64 != len) {
        return Err(bad(format!(
            "unexpected frame (tag {}, {len} bytes; wanted tag {tag}, {expect:?} bytes): ranks out of step",
            head[0]
        )));
    }
    buf.resize(len as usize, 0);
    s.read_exact(buf)
}

fn to_bytes(xs: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.extend(xs.iter().flat_map(|x| x.to_le_bytes()));
}

fn from_bytes(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl TcpCollective {
    /// Rank 0: accepts the other `key.world - 1` ranks of `key` on `listener` within
    /// `start_timeout` and welcomes them; each collective then waits at most `timeout` for a
    /// rank.
    pub fn lead(
        listener: TcpListener,
        key: &PoolKey,
        start_timeout: Duration,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let world = key.world;
        let deadline = Instant::now() + start_timeout;
        let mut links: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        let rendezvous = |m: String| CollectiveError::Rendezvous(m);
        listener
            .set_nonblocking(true)
            .map_err(|e| rendezvous(format!("listening: {e}")))?;
        while links.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((stream, peer)) => match Self::greet(stream, key, timeout) {
                    Ok((rank, stream)) if links[rank - 1].is_none() => {
                        links[rank - 1] = Some(stream);
                    }
                    Ok((rank, _)) => {
                        tracing::warn!(%peer, rank, "refused a second rank {rank}: taken");
                    }
                    Err(e) => tracing::warn!(%peer, "refused a joining rank: {e}"),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> =
                            (1..world).filter(|r| links[r - 1].is_none()).collect();
                        return Err(rendezvous(format!(
                            "ranks {missing:?} of {world} did not join within {start_timeout:?}"
                        )));
                    }
                    // Forming a pool only: the collectives themselves block on their sockets.
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(rendezvous(format!("accepting a rank: {e}"))),
            }
        }
        let mut links: Vec<TcpStream> = links.into_iter().flatten().collect();
        for (i, link) in links.iter_mut().enumerate() {
            write_frame(link, WELCOME, &[]).map_err(io(i + 1, "welcoming", timeout))?;
        }
        Ok(Self {
            rank: 0,
            world,
            links,
            timeout,
            scratch: Vec::new(),
        })
    }

    /// Reads a joining rank's `HELLO`: its rank, checked against `key`.
    fn greet(
        mut stream: TcpStream,
        key: &PoolKey,
        timeout: Duration,
    ) -> Result<(usize, TcpStream), CollectiveError> {
        let (world, epoch) = (key.world, key.epoch);
        let rendezvous = |m: String| CollectiveError::Rendezvous(m);
        stream
            .set_nonblocking(false)
            .and_then(|()| configure(&stream, timeout))
            .map_err(|e| rendezvous(format!("a joining rank: {e}")))?;
        let mut hello = Vec::new();
        read_frame(&mut stream, HELLO, Some(HELLO_BYTES), &mut hello)
            .map_err(|e| rendezvous(format!("a joining rank's hello: {e}")))?;
        let rank = u32::from_le_bytes([hello[0], hello[1], hello[2], hello[3]]) as usize;
        let theirs = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
        let their_epoch = u64::from_le_bytes(hello[8..16].try_into().unwrap_or_default());
        if theirs != world || rank == 0 || rank >= world {
            return Err(rendezvous(format!(
                "a rank joined as rank {rank} of {theirs}, but this pool has {world} ranks"
            )));
        }
        if their_epoch != epoch {
            return Err(rendezvous(format!(
                "rank {rank} joined epoch {their_epoch}, but this pool is epoch {epoch}"
            )));
        }
        // Compared in full, whatever the first difference: the time says nothing of where.
        let differ = hello[16..]
            .iter()
            .zip(key.proof())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differ != 0 {
            return Err(rendezvous(format!(
                "rank {rank} does not know this pool's secret (--comm-secret-file)"
            )));
        }
        Ok((rank, stream))
    }

    /// Rank `rank` > 0 of `key`'s pool: connects to rank 0 at `leader` (trying again for
    /// `limits.connect`, since ranks start in any order), says hello and waits for rank 0's
    /// welcome (at most `limits.welcome`: it welcomes once every rank is in and its own shard
    /// is loaded); each collective then waits at most `limits.collective` for rank 0.
    pub fn join(
        leader: SocketAddr,
        rank: usize,
        key: &PoolKey,
        limits: JoinLimits,
    ) -> Result<Self, CollectiveError> {
        let rendezvous = |m: String| CollectiveError::Rendezvous(m);
        let timeout = limits.collective;
        let deadline = Instant::now() + limits.connect;
        let mut stream = loop {
            let patience = limits.connect.max(Duration::from_millis(1));
            match TcpStream::connect_timeout(&leader, patience) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    wait_before_retry(&e);
                }
                Err(e) => {
                    return Err(rendezvous(format!(
                        "rank {rank} could not reach rank 0 at {leader} within {:?}: {e}",
                        limits.connect
                    )));
                }
            }
        };
        configure(&stream, timeout).map_err(io(0, "configuring the link", timeout))?;
        let mut hello = (rank as u32).to_le_bytes().to_vec();
        hello.extend((key.world as u32).to_le_bytes());
        hello.extend(key.epoch.to_le_bytes());
        hello.extend(key.proof());
        write_frame(&mut stream, HELLO, &hello).map_err(io(0, "saying hello", timeout))?;
        let welcome = limits.welcome.max(Duration::from_millis(1));
        stream
            .set_read_timeout(Some(welcome))
            .map_err(io(0, "configuring the link", timeout))?;
        read_frame(&mut stream, WELCOME, Some(0), &mut Vec::new()).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => rendezvous(format!(
                "rank 0 at {leader} did not welcome rank {rank} within {welcome:?} (is every rank of the pool started?)"
            )),
            _ => rendezvous(format!(
                "rank 0 at {leader} refused rank {rank} ({e}): another epoch, pool size or secret"
            )),
        })?;
        configure(&stream, timeout).map_err(io(0, "configuring the link", timeout))?;
        Ok(Self {
            rank,
            world: key.world,
            links: vec![stream],
            timeout,
            scratch: Vec::new(),
        })
    }

    /// On rank 0: sends `payload` to every other rank.
    fn send_all(&mut self, payload: &[u8]) -> Result<(), CollectiveError> {
        for (i, link) in self.links.iter_mut().enumerate() {
            write_frame(link, DATA, payload).map_err(io(i + 1, "sending", self.timeout))?;
        }
        Ok(())
    }

    /// On ranks > 0: sends `payload` to rank 0.
    fn send_up(&mut self, payload: &[u8]) -> Result<(), CollectiveError> {
        write_frame(&mut self.links[0], DATA, payload).map_err(io(0, "sending", self.timeout))
    }

    /// Reads a frame of `len` bytes from link `i` (rank `i + 1` on rank 0, else rank 0).
    fn recv(&mut self, i: usize, len: Option<usize>) -> Result<Vec<u8>, CollectiveError> {
        let peer = if self.rank == 0 { i + 1 } else { 0 };
        let mut buf = std::mem::take(&mut self.scratch);
        read_frame(&mut self.links[i], DATA, len, &mut buf).map_err(|e| {
            if e.kind() == ErrorKind::InvalidData {
                CollectiveError::Protocol {
                    rank: peer,
                    reason: e.to_string(),
                }
            } else {
                io(peer, "receiving", self.timeout)(e)
            }
        })?;
        Ok(buf)
    }
}

impl TcpCollective {
    /// Refuses `slots` that are not `world` pieces of `n`.
    fn check_gather(&self, what: &str, n: usize, slots: usize) -> Result<(), CollectiveError> {
        if slots == n * self.world {
            return Ok(());
        }
        Err(CollectiveError::Protocol {
            rank: self.rank,
            reason: format!("{what}: {slots} slots for {} ranks of {n}", self.world),
        })
    }
}

/// Waits a little before trying to reach rank 0 again (it may not be listening yet).
fn wait_before_retry(_last: &std::io::Error) {
    std::thread::sleep(Duration::from_millis(20));
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return Ok(());
        }
        let bytes = buf.len() * 4;
        let mut wire = Vec::new();
        if self.rank == 0 {
            // Rank order: 0, then 1, 2, … — the same bits on every run.
            for i in 0..self.links.len() {
                let theirs = self.recv(i, Some(bytes))?;
                for (acc, x) in buf.iter_mut().zip(from_bytes(&theirs)) {
                    *acc += x;
                }
                self.scratch = theirs;
            }
            to_bytes(buf, &mut wire);
            self.send_all(&wire)
        } else {
            to_bytes(buf, &mut wire);
            self.send_up(&wire)?;
            let sum = self.recv(0, Some(bytes))?;
            for (x, s) in buf.iter_mut().zip(from_bytes(&sum)) {
                *x = s;
            }
            self.scratch = sum;
            Ok(())
        }
    }

    fn all_gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.check_gather("all_gather", mine.len(), out.len())?;
        // Gathered at rank 0, then sent back to everyone.
        self.gather(mine, out)?;
        let mut wire = Vec::new();
        if self.rank == 0 {
            to_bytes(out, &mut wire);
            self.send_all(&wire)
        } else {
            let all = self.recv(0, Some(out.len() * 4))?;
            for (o, x) in out.iter_mut().zip(from_bytes(&all)) {
                *o = x;
            }
            self.scratch = all;
            Ok(())
        }
    }

    fn gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        let n = mine.len();
        if self.rank != 0 {
            let mut wire = Vec::new();
            to_bytes(mine, &mut wire);
            return self.send_up(&wire);
        }
        self.check_gather("gather", n, out.len())?;
        out[..n].copy_from_slice(mine);
        for i in 0..self.links.len() {
            let theirs = self.recv(i, Some(n * 4))?;
            for (o, x) in out[(i + 1) * n..(i + 2) * n]
                .iter_mut()
                .zip(from_bytes(&theirs))
            {
                *o = x;
            }
            self.scratch = theirs;
        }
        Ok(())
    }

    fn broadcast(&mut self, bytes: &mut Vec<u8>) -> Result<(), CollectiveError> {
        if self.world == 1 {
            return Ok(());
        }
        if self.rank == 0 {
            let payload = std::mem::take(bytes);
            let sent = self.send_all(&payload);
            *bytes = payload;
            sent
        } else {
            *bytes = self.recv(0, None)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
