//! A small mutation fuzzer that runs on stable Rust as ordinary tests (libFuzzer and AFL need
//! nightly or their own toolchains).
//!
//! Each target takes a seed corpus, and for its time budget feeds the target mutated inputs:
//! bit flips, interesting bytes, inserted, deleted and duplicated ranges, splices of two
//! entries, and boundary values written over 2-, 4- and 8-byte little-endian integers (the
//! length and count fields of binary formats). A panic is a finding: the input is saved under
//! `target/fuzz-crashes/` and the test fails, printing the seed that replays the run
//! (`FERRITE_FUZZ_SEED`). Every input kept in `tests/fuzz/regressions/<target>/` is replayed
//! first, each run.
//!
//! Budget: `FERRITE_FUZZ_SECONDS` per target (default 3, which is what CI runs; set 60 or more
//! to fuzz for real). It is coverage-free, so it finds shallow bugs: panics on lengths,
//! offsets, counts, types and UTF-8, which is where parsers of untrusted input usually break.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// xorshift64*: reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

const INTERESTING_BYTES: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'\\'];
const INTERESTING_U64: [u64; 9] = [
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// A position, mostly within the first `focus` bytes (a format's header) when set.
fn position(rng: &mut Rng, len: usize, focus: usize) -> usize {
    let within = if focus > 0 && rng.below(10) < 9 {
        focus.min(len)
    } else {
        len
    };
    rng.below(within)
}

/// One random mutation of `data` (`other`: a second corpus entry, for splices).
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], focus: usize) {
    let len = data.len();
    if len == 0 {
        data.push(INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())]);
        return;
    }
    let at = position(rng, len, focus);
    match rng.below(7) {
        0 => data[at] ^= 1 << rng.below(8),
        1 => data[at] = INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())],
        2 => {
            let n = 1 + rng.below(16).min(len - at);
            data.drain(at..(at + n).min(len));
        }
        3 => {
            let n = 1 + rng.below(32);
            let piece: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, piece);
        }
        4 => {
            let n = 1 + rng.below(64).min(len - at);
            let piece = data[at..(at + n).min(len)].to_vec();
            data.splice(at..at, piece);
        }
        5 if !other.is_empty() => {
            let from = rng.below(other.len());
            let n = 1 + rng.below(256).min(other.len() - from);
            data.splice(
                at..at,
                other[from..from + n.min(other.len() - from)]
                    .iter()
                    .copied(),
            );
        }
        _ => {
            let width = [2, 4, 8][rng.below(3)];
            if at + width <= len {
                let v = INTERESTING_U64[rng.below(INTERESTING_U64.len())].to_le_bytes();
                data[at..at + width].copy_from_slice(&v[..width]);
            }
        }
    }
}

/// A fuzz target: its name, corpus and where its mutations mostly land.
#[derive(Debug)]
pub struct Target {
    pub name: &'static str,
    pub corpus: Vec<Vec<u8>>,
    /// Mutations land in the first `focus` bytes nine times in ten (0: anywhere).
    pub focus: usize,
}

/// The per-target budget (`FERRITE_FUZZ_SECONDS`, default 3).
pub fn budget() -> Duration {
    let secs = std::env::var("FERRITE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs.max(0.0))
}

fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .nth(2)
        .map_or(here.clone(), Path::to_path_buf)
}

/// The inputs kept for `name` (every crash found, as a regression test).
pub fn regressions(name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = workspace_root().join("tests/fuzz/regressions").join(name);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| Some((p.clone(), std::fs::read(&p).ok()?)))
        .collect()
}

/// Saves a crashing input and fails with how to replay it.
fn found(name: &str, input: &[u8], seed: u64, what: &str) -> ! {
    let dir = workspace_root().join("target/fuzz-crashes");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{seed:x}-{}.bin", input.len()));
    let _ = std::fs::write(&path, input);
    let head: String = input.iter().take(64).map(|b| format!("{b:02x}")).collect();
    panic!(
        "fuzz {name}: {what} on a {}-byte input saved to {} (starts {head}); replay with \
         FERRITE_FUZZ_SEED={seed}, keep it under tests/fuzz/regressions/{name}/",
        input.len(),
        path.display()
    );
}

/// Runs `check` on every regression input, then on mutated corpus entries for the budget.
/// Returns how many inputs ran.
pub fn fuzz(target: Target, check: impl Fn(&[u8])) -> usize {
    let seed = std::env::var("FERRITE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let run = |input: &[u8], what: &str| {
        if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
            found(target.name, input, seed, what);
        }
    };
    for (path, input) in regressions(target.name) {
        run(&input, &format!("regression {} panicked", path.display()));
    }
    for input in &target.corpus {
        run(input, "a corpus entry panicked");
    }
    let mut rng = Rng::new(seed);
    let (started, budget) = (Instant::now(), budget());
    let mut ran = 0;
    while started.elapsed() < budget && !target.corpus.is_empty() {
        let mut input = target.corpus[rng.below(target.corpus.len())].clone();
        let other = &target.corpus[rng.below(target.corpus.len())];
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut input, other, target.focus);
        }
        run(&input, "panicked");
        ran += 1;
    }
    eprintln!(
        "fuzz {}: {ran} inputs in {:.1} s (seed {seed})",
        target.name,
        started.elapsed().as_secs_f64()
    );
    ran
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_reproducible_and_change_the_input() {
        let seed_input = b"{\"model\": \"m\", \"prompt\": \"hi\"}".to_vec();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut x = seed_input.clone();
            for _ in 0..8 {
                mutate(&mut rng, &mut x, b"other", 0);
            }
            x
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), seed_input);
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn a_panicking_target_is_reported() {
        let target = Target {
            name: "self-test",
            corpus: vec![b"ok".to_vec()],
            focus: 0,
        };
        let caught = catch_unwind(AssertUnwindSafe(|| {
            fuzz(target, |input| assert!(input == b"ok", "mutated"));
        }));
        assert!(
            caught.is_err(),
            "a mutated input should have failed the target"
        );
    }
}
