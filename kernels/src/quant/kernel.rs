//! Instruction-set selection and the row kernel: stored weight rows times f32 activation rows.

use std::fmt;

use super::{GgmlType, QuantError, check_bytes, scalar};

#[cfg(target_arch = "x86_64")]
use super::avx2::Avx2;

/// Which implementation of the kernels to run, ordered by capability: `Scalar < Neon < Avx2 <
/// Avx512` (a CPU has one architecture's levels; the order across them only serves the cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust (auto-vectorized where the compiler can); available everywhere.
    Scalar,
    /// ARM (aarch64) with the dot-product extension (`sdot`: Apple M1 on, Graviton 2 on): the
    /// portable kernels, compiled with it where integer dots are summed (`q8_dot.rs`).
    Neon,
    /// x86-64 AVX2 + FMA + F16C intrinsics.
    Avx2,
    /// AVX2, with AVX-512 (F/BW/VL/DQ/VNNI) for the kernels that have it: the f32 tile of
    /// multi-row products and the int8-activation dots of Q4_0, Q4_1 and Q8_0.
    Avx512,
}

impl Isa {
    /// The fastest implementation this CPU supports (detected once, then cached), within
    /// [`Isa::cap`].
    pub fn best() -> Self {
        [Self::Avx512, Self::Avx2, Self::Neon]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Self::Scalar)
    }

    /// The most the CPU detection admits to: the level `FERRITE_CPU_ISA` names (`scalar`,
    /// `neon`, `avx2`, `avxvnni` (AVX2 with AVX-VNNI) or `avx512`; unset or anything else: no
    /// cap), read once. Every kernel's detection obeys it, so an AVX-512 machine runs as a
    /// laptop without AVX-512 would, to measure or check that path.
    pub fn cap() -> Self {
        Self::caps().0
    }

    /// Whether [`Isa::cap`] admits AVX-VNNI, the VEX `vpdpbusd` of Intel's CPUs without
    /// AVX-512 since Alder Lake: not below `avxvnni` (`avx2` is a CPU without it: Intel's
    /// before Alder Lake, AMD's before Zen 4).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn cap_admits_avx_vnni() -> bool {
        Self::caps().1
    }

    /// [`Isa::cap`] and [`Isa::cap_admits_avx_vnni`], read once.
    fn caps() -> (Self, bool) {
        static CAP: std::sync::OnceLock<(Isa, bool)> = std::sync::OnceLock::new();
        *CAP.get_or_init(|| Self::parse_cap(std::env::var("FERRITE_CPU_ISA").ok()))
    }

    /// `FERRITE_CPU_ISA`'s value as a cap, and whether it admits AVX-VNNI.
    fn parse_cap(value: Option<String>) -> (Self, bool) {
        match value.as_deref().map(str::trim) {
            Some("scalar") => (Self::Scalar, false),
            Some("neon") => (Self::Neon, false),
            Some("avx2") => (Self::Avx2, false),
            Some("avxvnni") => (Self::Avx2, true),
            _ => (Self::Avx512, true),
        }
    }

    /// Whether this CPU can run `self`. Requesting an unavailable one falls back to scalar.
    pub fn is_available(self) -> bool {
        match self {
            Self::Scalar => true,
            Self::Neon => Self::has_dotprod(),
            Self::Avx2 | Self::Avx512 => self.simd().is_some(),
        }
    }

    /// Whether this is an ARM CPU with the dot-product extension, within [`Isa::cap`].
    #[cfg(target_arch = "aarch64")]
    fn has_dotprod() -> bool {
        Self::cap() >= Self::Neon && std::arch::is_aarch64_feature_detected!("dotprod")
    }

    #[cfg(not(target_arch = "aarch64"))]
    fn has_dotprod() -> bool {
        false
    }

    /// Whether `self` runs the AVX2 kernels (and is available).
    pub fn has_avx2(self) -> bool {
        self.simd().is_some()
    }

    /// The AVX2 token of `self` (carrying AVX-512 for [`Isa::Avx512`]), if available.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn simd(self) -> Option<Avx2> {
        match self {
            Self::Scalar | Self::Neon => None,
            Self::Avx2 => Avx2::detect(),
            Self::Avx512 => Avx2::with_avx512(),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) fn simd(self) -> Option<()> {
        None
    }

    /// A short lowercase name (`"scalar"`, `"neon"`, `"avx2"`, `"avx512"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Neon => "neon",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy)]
enum Imp {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
}

/// Multiplies blocks of stored weight rows with f32 activation rows, for one type and row
/// length; the implementation is resolved once at construction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowKernel {
    ty: GgmlType,
    k: usize,
    imp: Imp,
}

impl RowKernel {
    /// A kernel for rows of `k` elements of `ty`, using `isa` if available (else scalar).
    pub(crate) fn new(isa: Isa, ty: GgmlType, k: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        let imp = isa.simd().map_or(Imp::Scalar, Imp::Avx2);
        #[cfg(not(target_arch = "x86_64"))]
        let imp = {
            let _ = isa; // the f32 rows have x86 kernels only
            Imp::Scalar
        };
        Self { ty, k, imp }
    }

    /// The f32 scratch length [`Self::run`] needs.
    pub(crate) fn scratch_len(&self) -> usize {
        match self.imp {
            Imp::Scalar => self.k,
            #[cfg(target_arch = "x86_64")]
            Imp::Avx2(_) => 0,
        }
    }

    /// `outs[i][j] = row_j · x[i*k..(i+1)*k]` for `j < nrows`, `i < outs.len()`, where `rows`
    /// holds `nrows` contiguous stored rows.
    ///
    /// # Panics
    /// If `rows`, `x`, an output or `scratch` (see [`Self::scratch_len`]) is too short or long.
    pub(crate) fn run(
        &self,
        rows: &[u8],
        nrows: usize,
        x: &[f32],
        outs: &mut [&mut [f32]],
        scratch: &mut [f32],
    ) {
        let k = self.k;
        match self.imp {
            #[cfg(target_arch = "x86_64")]
            Imp::Avx2(t) => t.rows(self.ty, k, rows, nrows, x, outs),
            Imp::Scalar => {
                let be = self.ty.block_elems();
                assert!(
                    k.is_multiple_of(be),
                    "row length not a whole number of blocks"
                );
                let rb = k / be * self.ty.block_bytes();
                assert_eq!(rows.len(), rb * nrows, "weight bytes");
                assert_eq!(x.len(), outs.len() * k, "activation length");
                let w = &mut scratch[..k];
                for (j, row) in rows.chunks_exact(rb.max(1)).enumerate().take(nrows) {
                    scalar::dequantize(self.ty, row, w);
                    for (o, xi) in outs.iter_mut().zip(x.chunks_exact(k.max(1))) {
                        o[j] = scalar::dot_f32(w, xi);
                    }
                }
                if k == 0 {
                    for o in outs.iter_mut() {
                        o[..nrows].fill(0.0);
                    }
                }
            }
        }
    }
}

/// `Σ dequantize(row) · x`: the dot product of one stored row of `x.len()` elements of `ty`
/// with f32 activations, on the fastest available [`Isa`].
pub fn vec_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    vec_dot_with(Isa::best(), ty, row, x)
}

/// [`vec_dot`] on a chosen [`Isa`] (falls back to scalar if `isa` is unavailable).
pub fn vec_dot_with(isa: Isa, ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    check_bytes(ty, x.len(), row)?;
    let kern = RowKernel::new(isa, ty, x.len());
    let mut scratch = vec![0f32; kern.scratch_len()];
    let mut y = [0f32];
    kern.run(row, 1, x, &mut [&mut y[..]], &mut scratch);
    Ok(y[0])
}

#[cfg(test)]
mod tests {
    use super::Isa;

    #[test]
    fn the_isa_cap_names_a_level_or_caps_nothing() {
        let cap = |v: Option<&str>| Isa::parse_cap(v.map(String::from));
        assert_eq!(cap(Some("avx2")), (Isa::Avx2, false));
        assert_eq!(cap(Some("avxvnni")), (Isa::Avx2, true));
        assert_eq!(cap(Some(" scalar\n")), (Isa::Scalar, false));
        assert_eq!(cap(Some("avx512")), (Isa::Avx512, true));
        assert_eq!(cap(Some("neon")), (Isa::Neon, false));
        assert_eq!(
            cap(Some("sve2")),
            (Isa::Avx512, true),
            "an unknown name caps nothing"
        );
        assert_eq!(cap(None), (Isa::Avx512, true));
        assert!(Isa::Scalar < Isa::Neon && Isa::Neon < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
    }
}
