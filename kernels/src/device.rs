//! Which device runs the model: `--device cpu|cuda[:N]|auto`.
//!
//! CUDA is probed without panicking: cudarc loads libcuda at run time and panics on first use
//! when the library is absent, so its presence is checked first (`is_culib_present`), then the
//! driver is asked for its devices. `auto` takes CUDA when it can and otherwise says in one line
//! why it runs on the CPU.
//!
//! `--device cuda[:N]` runs the model on that device ([`crate::cuda`]); `auto` runs it on
//! `cuda:0` when the driver reports and opens one (the backend passed its checks on an H100,
//! issue #24), and on the CPU otherwise, saying why in one line.

use std::fmt;
use std::str::FromStr;

/// What `--device` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// CUDA device 0 if usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device (cpu, cuda, cuda:N or auto)")),
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A CUDA device the driver reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
}

impl fmt::Display for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cuda:{} ({}, sm_{}{}, {:.0} GiB)",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.total_memory as f64 / (1u64 << 30) as f64
        )
    }
}

/// The CUDA devices of this machine, or why there are none.
pub fn cuda_devices() -> Result<Vec<CudaDevice>, String> {
    // SAFETY: only tries to open the driver library (dlopen) and closes it again.
    #[allow(unsafe_code)]
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err("no CUDA driver (libcuda could not be loaded)".into());
    }
    use cudarc::driver::CudaContext;
    let count = CudaContext::device_count().map_err(|e| format!("the CUDA driver failed: {e}"))?;
    if count <= 0 {
        return Err("the CUDA driver reports no devices".into());
    }
    (0..count as usize)
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| format!("cuda:{ordinal} could not be opened: {e}"))?;
            let err = |e: cudarc::driver::DriverError| format!("cuda:{ordinal}: {e}");
            Ok(CudaDevice {
                ordinal,
                name: ctx.name().map_err(err)?,
                compute_capability: ctx.compute_capability().map_err(err)?,
                total_memory: ctx.total_mem().map_err(err)?,
            })
        })
        .collect()
}

/// The device a process runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(CudaDevice),
}

/// Why `--device` could not be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--device {request}: {reason}")]
pub struct DeviceError {
    pub request: DeviceRequest,
    pub reason: String,
}

/// Picks the device for `request`. Returns it and, when `auto` fell back to the CPU, the
/// one-line reason.
pub fn select(request: DeviceRequest) -> Result<(Device, Option<String>), DeviceError> {
    choose(request, usable_cuda_devices)
}

/// [`cuda_devices`], or why they cannot run ferrite: its kernels are compiled with NVRTC, so
/// a driver without `libnvrtc` does not count as a working GPU.
fn usable_cuda_devices() -> Result<Vec<CudaDevice>, String> {
    let devices = cuda_devices()?;
    if !crate::cuda::nvrtc::nvrtc_present() {
        return Err(format!(
            "{} found, but libnvrtc (which compiles ferrite's kernels) could not be loaded",
            devices
                .first()
                .map_or_else(|| "a CUDA driver".into(), |d| d.to_string())
        ));
    }
    Ok(devices)
}

/// [`select`] with the CUDA probe's answer (what [`cuda_devices`] returns) given: asked only
/// when `request` can use a GPU, so `--device cpu` never loads the driver.
pub fn choose(
    request: DeviceRequest,
    probe: impl FnOnce() -> Result<Vec<CudaDevice>, String>,
) -> Result<(Device, Option<String>), DeviceError> {
    match request {
        DeviceRequest::Cpu => Ok((Device::Cpu, None)),
        DeviceRequest::Auto => match probe() {
            Ok(devices) => match devices.into_iter().next() {
                Some(d) => Ok((Device::Cuda(d), None)),
                None => Ok((
                    Device::Cpu,
                    Some("no CUDA device; running on the CPU".into()),
                )),
            },
            Err(reason) => Ok((Device::Cpu, Some(format!("{reason}; running on the CPU")))),
        },
        DeviceRequest::Cuda(n) => {
            let error = |reason| DeviceError { request, reason };
            let devices = probe().map_err(|r| error(format!("{r}; use --device cpu")))?;
            let count = devices.len();
            let d = devices.into_iter().nth(n).ok_or_else(|| {
                error(format!(
                    "this machine has {count} CUDA device(s) (cuda:0..cuda:{})",
                    count.saturating_sub(1)
                ))
            })?;
            Ok((Device::Cuda(d), None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!("cpu".parse(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceRequest::Cuda(3)));
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        for bad in ["gpu", "cuda:", "cuda:x", "CUDA"] {
            assert!(bad.parse::<DeviceRequest>().is_err(), "{bad}");
        }
    }

    fn h100(ordinal: usize) -> CudaDevice {
        CudaDevice {
            ordinal,
            name: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: (9, 0),
            total_memory: 80 << 30,
        }
    }

    #[test]
    fn auto_takes_the_first_gpu_the_probe_reports() {
        let got = choose(DeviceRequest::Auto, || Ok(vec![h100(0), h100(1)]));
        assert_eq!(got, Ok((Device::Cuda(h100(0)), None)));
    }

    /// Without a usable GPU `auto` runs on the CPU and says why in one line: the probe's
    /// reason (no driver, a failing driver), or that it found no device.
    #[test]
    fn auto_falls_back_to_the_cpu_with_the_reason() {
        let reason = "no CUDA driver (libcuda could not be loaded)";
        for (probe, says) in [
            (Err(reason.to_owned()), reason),
            (Ok(vec![]), "no CUDA device"),
        ] {
            let (device, why) = choose(DeviceRequest::Auto, || probe).expect("auto never fails");
            assert_eq!(device, Device::Cpu);
            let why = why.expect("a reason");
            assert!(
                why.contains(says) && why.ends_with("running on the CPU"),
                "{why}"
            );
            assert!(!why.contains('\n'), "one line: {why}");
        }
    }

    #[test]
    fn cpu_never_probes_and_cuda_n_takes_that_device_or_says_how_many() {
        let unreachable =
            || -> Result<Vec<CudaDevice>, String> { panic!("probed for --device cpu") };
        assert_eq!(
            choose(DeviceRequest::Cpu, unreachable),
            Ok((Device::Cpu, None))
        );
        let two = || Ok(vec![h100(0), h100(1)]);
        assert_eq!(
            choose(DeviceRequest::Cuda(1), two),
            Ok((Device::Cuda(h100(1)), None))
        );
        let e = choose(DeviceRequest::Cuda(2), two).expect_err("cuda:2 of two");
        assert_eq!(
            e.to_string(),
            "--device cuda:2: this machine has 2 CUDA device(s) (cuda:0..cuda:1)"
        );
        let e = choose(DeviceRequest::Cuda(0), || Err("no CUDA driver".into())).expect_err("none");
        assert_eq!(
            e.to_string(),
            "--device cuda:0: no CUDA driver; use --device cpu"
        );
    }

    /// On this machine, with the real probe: the CPU is always selectable, `auto` never fails
    /// and agrees with the probe, and CUDA is either chosen (a device is there) or refused with
    /// a reason — never a panic.
    #[test]
    fn selection_never_panics() {
        assert_eq!(select(DeviceRequest::Cpu), Ok((Device::Cpu, None)));
        let (d, why) = select(DeviceRequest::Auto).expect("auto");
        match usable_cuda_devices() {
            Ok(devices) if !devices.is_empty() => {
                assert_eq!((d, why), (Device::Cuda(devices[0].clone()), None));
            }
            _ => assert!(d == Device::Cpu && why.is_some_and(|w| !w.is_empty())),
        }
        match (select(DeviceRequest::Cuda(0)), usable_cuda_devices()) {
            (Ok((Device::Cuda(d), None)), Ok(devices)) => assert_eq!(Some(&d), devices.first()),
            (Err(e), Err(_)) => {
                assert!(e.to_string().starts_with("--device cuda:0: "), "{e}");
                assert!(e.to_string().contains("--device cpu"), "{e}");
            }
            (got, devices) => panic!("select gave {got:?} with devices {devices:?}"),
        }
    }
}
