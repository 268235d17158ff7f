//! The `gpu` worker: reads the node's GPUs (NVML, synchronous, so on the blocking pool)
//! every two seconds and feeds the governor that sizes background work.

use std::sync::Arc;
use std::time::Duration;

use shoal_resource_guard::GpuProbe;
use tracing::info;

use crate::worker::{Step, Ticker, Worker};
use crate::{AgentError, Resources};

pub struct GpuPoller {
    resources: Arc<Resources>,
    probe: Option<Box<dyn GpuProbe>>,
    first: bool,
    ticker: Ticker,
}

impl GpuPoller {
    pub fn new(resources: Arc<Resources>, probe: Box<dyn GpuProbe>) -> Self {
        GpuPoller {
            resources,
            probe: Some(probe),
            first: true,
            ticker: Ticker::every(Duration::from_secs(2)),
        }
    }
}

impl Worker for GpuPoller {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "gpu"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        let Some(mut probe) = self.probe.take() else {
            return Ok(Step::Done);
        };
        let (probe, sample) = tokio::task::spawn_blocking(move || {
            let sample = probe.sample();
            (probe, sample)
        })
        .await
        .map_err(|e| AgentError::Setup {
            what: "a GPU reading",
            source: std::io::Error::other(e),
        })?;
        self.probe = Some(probe);
        if self.first {
            match &sample.unavailable {
                Some(reason) => info!(%reason, "GPU probe"),
                None => info!(
                    gpus = sample.count,
                    "GPU probe: NVML is reading the node's GPUs"
                ),
            }
            self.first = false;
        }
        self.resources.observe(sample);
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}
