//! The `metrics` worker: refreshes the metadata gauges from openraft's metrics and the
//! local replica once a second.

use std::sync::Arc;
use std::time::Duration;

use crate::AgentError;
use crate::consensus::Group;
use crate::worker::{Step, Ticker, Worker};

pub struct MetricsRefresh {
    group: Arc<Group>,
    ticker: Ticker,
}

impl MetricsRefresh {
    pub fn new(group: Arc<Group>) -> MetricsRefresh {
        MetricsRefresh {
            group,
            ticker: Ticker::every(Duration::from_secs(1)),
        }
    }
}

impl Worker for MetricsRefresh {
    type Error = AgentError;

    fn name(&self) -> &'static str {
        "metrics"
    }

    async fn work(&mut self) -> Result<Step, AgentError> {
        self.group.refresh_metrics();
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) {
        self.ticker.tick().await;
    }
}
