//! GPU probe: count, utilisation and memory of the node's GPUs. NVML is synchronous; the
//! agent polls it from one blocking thread every few seconds.

use std::sync::Mutex;

use nvml_wrapper::Nvml;

/// One reading of every GPU on the node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    pub count: u32,
    /// Mean utilisation over the GPUs, percent (None without GPUs).
    pub utilization_percent: Option<f64>,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Why there is no reading, for status ("no NVIDIA library", ...).
    pub unavailable: Option<String>,
}

/// A sample that says why there are no GPUs.
pub fn no_gpu(reason: impl Into<String>) -> GpuSample {
    GpuSample {
        unavailable: Some(reason.into()),
        ..GpuSample::default()
    }
}

pub trait GpuProbe: Send {
    fn sample(&mut self) -> GpuSample;
}

/// NVML through nvml-wrapper. A node without NVIDIA's library is a normal case: every
/// sample then says "no GPU".
pub struct NvmlProbe {
    nvml: Option<Nvml>,
    init_error: String,
}

impl NvmlProbe {
    pub fn init() -> Self {
        match Nvml::init() {
            Ok(nvml) => NvmlProbe {
                nvml: Some(nvml),
                init_error: String::new(),
            },
            Err(e) => NvmlProbe {
                nvml: None,
                init_error: format!("no GPU (NVML unavailable: {e})"),
            },
        }
    }
}

impl GpuProbe for NvmlProbe {
    fn sample(&mut self) -> GpuSample {
        let Some(nvml) = &self.nvml else {
            return no_gpu(self.init_error.clone());
        };
        let count = match nvml.device_count() {
            Ok(n) => n,
            Err(e) => return no_gpu(format!("NVML device count failed: {e}")),
        };
        if count == 0 {
            return no_gpu("no GPU (NVML sees 0 devices)");
        }
        let mut util_sum = 0.0;
        let mut util_n = 0;
        let mut used = 0;
        let mut total = 0;
        for i in 0..count {
            let Ok(dev) = nvml.device_by_index(i) else {
                continue;
            };
            if let Ok(u) = dev.utilization_rates() {
                util_sum += u.gpu as f64;
                util_n += 1;
            }
            if let Ok(m) = dev.memory_info() {
                used += m.used;
                total += m.total;
            }
        }
        GpuSample {
            count,
            utilization_percent: (util_n > 0).then(|| util_sum / util_n as f64),
            memory_used_bytes: used,
            memory_total_bytes: total,
            unavailable: None,
        }
    }
}

/// A probe that returns whatever the test sets.
#[derive(Default)]
pub struct FakeGpu {
    next: Mutex<GpuSample>,
}

impl FakeGpu {
    pub fn set(&self, sample: GpuSample) {
        *self.next.lock().unwrap_or_else(|p| p.into_inner()) = sample;
    }
}

impl GpuProbe for FakeGpu {
    fn sample(&mut self) -> GpuSample {
        self.next.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nvidia_library_means_no_gpu_not_a_failure() {
        // The build machines have no NVIDIA library; a GPU machine has one. Either way the
        // probe answers.
        let mut probe = NvmlProbe::init();
        let s = probe.sample();
        if s.count == 0 {
            assert!(
                s.unavailable
                    .as_deref()
                    .is_some_and(|r| r.contains("no GPU")),
                "{s:?}"
            );
        } else {
            assert!(s.utilization_percent.is_some());
        }
    }
}
