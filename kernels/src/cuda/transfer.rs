//! Copies at device addresses ([`DevPtr`]) rather than through cudarc's typed slices: the
//! runner's buffers hold several tensors each, and a tensor-parallel step moves parts of them
//! (a projection's partial sums to the host and back, logits columns into place).

use cudarc::driver::{CudaEvent, DeviceRepr, PinnedHostSlice, ValidAsZeroBits, result, sys};

use super::{CudaError, DevPtr, Gpu};

/// Page-locked room for small copies to the device queued behind the stream's work, for a step
/// that must not wait for its own forward: a copy from pageable memory may wait for the stream
/// first (CUDA's API synchronization rules let the driver do so to stage it), and
/// [`Gpu::upload_at`] waits for it on purpose.
pub struct QueuedUpload<T: DeviceRepr> {
    host: PinnedHostSlice<T>,
    /// Recorded after each copy out of `host`; waited for before `host` is written again.
    copied: CudaEvent,
}

impl<T: DeviceRepr> Drop for QueuedUpload<T> {
    fn drop(&mut self) {
        // A copy may still read the room: let it finish before the slice frees it (the
        // slice's own wait is on an event never recorded). An error has nowhere to go here.
        let _ = self.copied.synchronize();
    }
}

impl<T: DeviceRepr> std::fmt::Debug for QueuedUpload<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuedUpload({} elements)", self.host.len())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> QueuedUpload<T> {
    /// Room for `len` elements.
    pub fn new(gpu: &Gpu, len: usize) -> Result<Self, CudaError> {
        let ctx = gpu.context();
        // SAFETY: page-locked host memory the host only writes (write-combined) and the
        // device reads through the copies `queue` makes, each waited for before a rewrite.
        let host = unsafe {
            ctx.alloc_pinned_with_flags::<T>(len.max(1), sys::CU_MEMHOSTALLOC_WRITECOMBINED)
        }?;
        let copied = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        Ok(Self { host, copied })
    }

    /// Queues a copy of `src` to `dst` on `gpu`'s stream, after the work queued before it, and
    /// returns without waiting for either (only for the previous copy out of this room).
    ///
    /// # Safety
    /// `dst` addresses room for `src.len()` elements of `T` on `gpu`'s device, alive until the
    /// copy has run.
    #[allow(unsafe_code)]
    pub unsafe fn queue(&mut self, gpu: &Gpu, dst: DevPtr, src: &[T]) -> Result<(), CudaError> {
        let room = self.host.len();
        if src.len() > room {
            return Err(CudaError::Driver(format!(
                "{} elements queued for a copy through room for {room}",
                src.len()
            )));
        }
        self.copied.synchronize()?;
        // `as_mut_slice` waits on the slice's own event, which cudarc never records here
        // (event tracking is off): `copied` is what orders the rewrite after the last copy.
        let host = &mut self.host.as_mut_slice()?[..src.len()];
        host.copy_from_slice(src);
        gpu.context().bind_to_thread()?;
        let stream = gpu.stream();
        // SAFETY: the caller's contract for `dst`; `host` is page-locked and is not written
        // again before `copied`, recorded next, says this copy has run.
        unsafe { result::memcpy_htod_async(dst.0, host, stream.cu_stream()) }?;
        Ok(self.copied.record(stream)?)
    }
}

impl Gpu {
    /// Copies `dst.len()` elements at `src` to the host, after the work queued before it.
    ///
    /// # Safety
    /// `src` addresses `dst.len()` elements of `T` on this device.
    #[allow(unsafe_code)]
    pub unsafe fn download_at<T>(&self, src: DevPtr, dst: &mut [T]) -> Result<(), CudaError> {
        self.context().bind_to_thread()?;
        let s = self.stream().cu_stream();
        // SAFETY: the caller's contract; the synchronize keeps `dst` borrowed until the copy
        // has landed.
        unsafe { result::memcpy_dtoh_async(dst, src.0, s) }?;
        self.synchronize()
    }

    /// Copies `src` to `dst` on the device, in stream order; returns once `src` may be reused.
    ///
    /// # Safety
    /// `dst` addresses room for `src.len()` elements of `T` on this device.
    #[allow(unsafe_code)]
    pub unsafe fn upload_at<T>(&self, dst: DevPtr, src: &[T]) -> Result<(), CudaError> {
        self.context().bind_to_thread()?;
        let s = self.stream().cu_stream();
        // SAFETY: the caller's contract; a copy from pageable memory has read it before the
        // call returns, but the synchronize makes that plain rather than a driver detail.
        unsafe { result::memcpy_htod_async(dst.0, src, s) }?;
        self.synchronize()
    }

    /// Queues a copy of `rows` rows of `width` bytes from `src` (rows `src_pitch` bytes
    /// apart) to `dst` (rows `dst_pitch` bytes apart): one cuMemcpy2D, captured into a graph
    /// when the stream is capturing.
    ///
    /// # Safety
    /// Both regions lie in device memory alive until the copy has run.
    #[allow(unsafe_code)]
    pub unsafe fn copy_rows(
        &self,
        dst: DevPtr,
        dst_pitch: usize,
        src: DevPtr,
        src_pitch: usize,
        width: usize,
        rows: usize,
    ) -> Result<(), CudaError> {
        if width == 0 || rows == 0 {
            return Ok(());
        }
        self.context().bind_to_thread()?;
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src.0,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst.0,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch,
            WidthInBytes: width,
            Height: rows,
        };
        // SAFETY: the caller's contract; `copy` describes two device regions.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.stream().cu_stream()) }.result()?;
        Ok(())
    }
}
