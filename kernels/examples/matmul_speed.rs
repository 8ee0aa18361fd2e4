//! Times `matmul` on the default model's shapes.
//!
//! ```text
//! cargo run -p ferrite-kernels --release --example matmul_speed [-- --scalar|--avx2] [-- --quick]
//! ```
//!
//! For each (type, n, k, m) it reports time per call, GFLOP/s (`2·m·n·k / t`) and GB/s of
//! weights streamed (`bytes(W) / t`), and GF/cpu: GFLOP per second of on-CPU time summed over
//! all threads (robust to other processes competing for the cores). Each twice: "hot" re-runs the same weight (it may sit in
//! cache), "cold" cycles through enough copies (≥ 96 MiB) that every call streams from DRAM,
//! as a real decode step over a whole model does.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ferrite_kernels::cpu::matmul::{WeightView, matmul_with};
use ferrite_kernels::quant::{GgmlType, Isa};

const SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];
const TYPES: [GgmlType; 3] = [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F32];
const COLD_BYTES: usize = 96 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// Random valid weight bytes (finite f16 scales).
fn weight(rng: &mut Rng, ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    if ty == GgmlType::F32 {
        return (0..n * k).flat_map(|_| rng.f32().to_le_bytes()).collect();
    }
    let bb = ty.block_bytes();
    let mut b: Vec<u8> = (0..n * k / ty.block_elems() * bb)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in b.chunks_exact_mut(bb) {
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.01 + 0.01 * rng.f32()).to_le_bytes());
        if ty == GgmlType::Q4_1 {
            blk[2..4].copy_from_slice(&half::f16::from_f32(0.1 * rng.f32()).to_le_bytes());
        }
    }
    b
}

/// On-CPU nanoseconds of all this process's threads so far (Linux), to see through contention
/// from other processes on a shared machine.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Mean (wall, on-CPU) seconds per call over ~`budget`, cycling through `ws`.
fn time(
    isa: Isa,
    x: &[f32],
    m: usize,
    ws: &[WeightView<'_>],
    out: &mut [f32],
    budget: Duration,
) -> (f64, f64) {
    for w in ws.iter().take(3) {
        matmul_with(isa, x, m, w, out); // warm-up
    }
    let start = Instant::now();
    let cpu0 = cpu_ns();
    let mut calls = 0usize;
    loop {
        for w in ws {
            matmul_with(isa, black_box(x), m, w, out);
            calls += 1;
        }
        black_box(&mut *out);
        if start.elapsed() >= budget && calls >= 5 {
            break;
        }
    }
    let wall = start.elapsed().as_secs_f64() / calls as f64;
    let cpu = match (cpu0, cpu_ns()) {
        (Some(a), Some(b)) => (b - a) as f64 * 1e-9 / calls as f64,
        _ => f64::NAN,
    };
    (wall, cpu)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let isa = if args.iter().any(|a| a == "--scalar") {
        Isa::Scalar
    } else if args.iter().any(|a| a == "--avx2") {
        Isa::Avx2
    } else {
        Isa::best()
    };
    let budget = Duration::from_millis(if args.iter().any(|a| a == "--quick") {
        100
    } else {
        400
    });
    println!(
        "isa={isa} rayon_threads={} (time per call; GFLOP/s = 2mnk/t; GB/s = weight bytes/t)",
        rayon::current_num_threads()
    );
    println!(
        "{:<5} {:>6} {:>5} {:>2} | {:>9} {:>7} {:>6} {:>7} | {:>9} {:>7} {:>6} {:>7}",
        "type",
        "n",
        "k",
        "m",
        "hot",
        "GFLOP/s",
        "GB/s",
        "GF/cpu",
        "cold",
        "GFLOP/s",
        "GB/s",
        "GF/cpu"
    );
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for ty in TYPES {
        for (n, k) in SHAPES {
            let one = weight(&mut rng, ty, n, k);
            let copies = COLD_BYTES.div_ceil(one.len()).max(1);
            let data: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
            let ws: Vec<WeightView<'_>> = data
                .iter()
                .filter_map(|b| WeightView::new(ty, n, k, b).ok())
                .collect();
            let mut base = [0.0; 2];
            let ms: &[usize] = if args.iter().any(|a| a == "--prefill") {
                &[128]
            } else {
                &[1, 8]
            };
            for &m in ms {
                let x: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
                let mut out = vec![0f32; m * n];
                let hot = time(isa, &x, m, &ws[..1], &mut out, budget);
                let cold = time(isa, &x, m, &ws, &mut out, budget);
                let flop = 2.0 * (m * n * k) as f64;
                let gb = one.len() as f64 / 1e9;
                let cols = |(wall, cpu): (f64, f64)| {
                    format!(
                        "{:>7.1}µs {:>7.1} {:>6.1} {:>7.1}",
                        wall * 1e6,
                        flop / wall / 1e9,
                        gb / wall,
                        flop / cpu / 1e9
                    )
                };
                print!(
                    "{:<5} {n:>6} {k:>5} {m:>2} | {} | {}",
                    ty.name(),
                    cols(hot),
                    cols(cold)
                );
                if m == 1 {
                    base = [hot.0, cold.0];
                    println!();
                } else {
                    // Aggregate throughput of m rows relative to m single-row calls.
                    let s = |b: f64, t: f64| m as f64 * b / t;
                    println!(
                        "  batch-{m} aggregate: {:.1}x hot, {:.1}x cold",
                        s(base[0], hot.0),
                        s(base[1], cold.0)
                    );
                }
            }
        }
    }
}
