//! Which device runs the model: `--device cpu|cuda[:N]|auto`.
//!
//! CUDA is probed without panicking: cudarc loads libcuda at run time and panics on first use
//! when the library is absent, so its presence is checked first (`is_culib_present`), then the
//! driver is asked for its devices. `auto` takes CUDA when it can and otherwise says in one line
//! why it runs on the CPU.
//!
//! `--device cuda[:N]` runs the model on that device ([`crate::cuda`]). `auto` still chooses the
//! CPU when it finds a GPU, and says so: the CUDA backend has not yet been verified on GPU
//! hardware, so it is used only when asked for by name.

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
    let not_chosen = |d: &CudaDevice| {
        format!(
            "{d} found; the CUDA backend runs only when asked for (--device cuda) until it is \
             verified on GPU hardware, so the CPU runs the model"
        )
    };
    match request {
        DeviceRequest::Cpu => Ok((Device::Cpu, None)),
        DeviceRequest::Auto => {
            let why = match cuda_devices() {
                Ok(devices) => devices
                    .first()
                    .map_or_else(|| "no CUDA device".to_owned(), &not_chosen),
                Err(reason) => format!("{reason}; running on the CPU"),
            };
            Ok((Device::Cpu, Some(why)))
        }
        DeviceRequest::Cuda(n) => {
            let error = |reason| DeviceError { request, reason };
            let devices = cuda_devices().map_err(|r| error(format!("{r}; use --device cpu")))?;
            let d = devices.get(n).ok_or_else(|| {
                error(format!(
                    "this machine has {} CUDA device(s) (cuda:0..cuda:{})",
                    devices.len(),
                    devices.len().saturating_sub(1)
                ))
            })?;
            Ok((Device::Cuda(d.clone()), None))
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

    /// On any machine: the CPU is always selectable, `auto` never fails, and CUDA is either
    /// chosen (a device is there) or refused with a reason — never a panic.
    #[test]
    fn selection_never_panics() {
        assert_eq!(select(DeviceRequest::Cpu), Ok((Device::Cpu, None)));
        let (d, why) = select(DeviceRequest::Auto).expect("auto");
        assert_eq!(d, Device::Cpu);
        assert!(why.is_some_and(|w| !w.is_empty()));
        match (select(DeviceRequest::Cuda(0)), cuda_devices()) {
            (Ok((Device::Cuda(d), None)), Ok(devices)) => assert_eq!(Some(&d), devices.first()),
            (Err(e), Err(_)) => {
                assert!(e.to_string().starts_with("--device cuda:0: "), "{e}");
                assert!(e.to_string().contains("--device cpu"), "{e}");
            }
            (got, devices) => panic!("select gave {got:?} with devices {devices:?}"),
        }
    }
}
