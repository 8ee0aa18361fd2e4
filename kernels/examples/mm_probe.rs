// temporary probe (not committed)
use ferrite_kernels::cpu::matmul::{WeightView, matmul_with};
use ferrite_kernels::quant::{GgmlType, Isa};
fn cpu_ns() -> u64 { std::fs::read_to_string("/proc/thread-self/schedstat").unwrap().split_whitespace().next().unwrap().parse().unwrap() }
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty: GgmlType = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(GgmlType::Q4_1);
    let (n, k) = (576usize, 576usize);
    let mut b = vec![0u8; ty.row_bytes(k).unwrap() * n];
    let mut r = 1u64; for v in b.iter_mut() { r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); *v = (r >> 33) as u8; }
    if ty.is_quantized() { for blk in b.chunks_exact_mut(ty.block_bytes()) { blk[0] = 0; blk[1] = 0x20; if ty == GgmlType::Q4_1 { blk[2]=0; blk[3]=0xA0; } } }
    else if ty == GgmlType::F32 { for c in b.chunks_exact_mut(4) { c.copy_from_slice(&0.5f32.to_le_bytes()); } }
    let w = WeightView::new(ty, n, k, &b).unwrap();
    for m in [1usize, 2, 4, 8, 16] {
        let x = vec![0.25f32; m * k]; let mut out = vec![0f32; m * n];
        let iters = 2000 / m.max(1) + 50;
        let c0 = cpu_ns();
        for _ in 0..iters { matmul_with(Isa::Avx2, &x, m, &w, &mut out); }
        let ns = (cpu_ns() - c0) as f64 / iters as f64;
        println!("{ty} m={m:2}: {:8.1} µs/call  {:6.2} ns per row-block(32)  {:5.1} GF/cpu", ns / 1e3, ns / (m * n * k / 32) as f64, 2.0 * (m*n*k) as f64 / ns);
    }
}
