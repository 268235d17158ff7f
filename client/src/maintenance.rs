//! Maintenance commands: `shoal ok-to-stop`.

use std::path::Path;

use shoal_agent_api::{AgentClient, OkToStop, Request, Response};

/// The answer was "no": already printed; the process exits 1 without an error line.
#[derive(Debug, thiserror::Error)]
#[error("not ok to stop")]
pub struct NotOk;

/// `shoal ok-to-stop NODE`: prints the assessment; `Err(NotOk)` when stopping is not safe.
pub fn ok_to_stop(socket: &Path, node: &str, json: bool) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let response = rt.block_on(async {
        let mut client = AgentClient::connect(socket).await?;
        client
            .call(&Request::OkToStop {
                node: node.to_owned(),
            })
            .await
    })?;
    let r = match response {
        Response::OkToStop(r) => r,
        Response::Error(e) => anyhow::bail!("agent: {e}"),
        other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", render(&r));
    }
    if r.ok { Ok(()) } else { Err(NotOk.into()) }
}

fn render(r: &OkToStop) -> String {
    let who = format!("{} ({})", r.name, r.node);
    let mut out = if r.ok {
        format!(
            "ok to stop {who}: the {} stripe(s) with a shard on it keep at least k+1 shards available; the metadata group keeps {} of {} voters\n",
            r.stripes_on_node, r.voters_alive_after, r.voters
        )
    } else {
        format!("NOT ok to stop {who}:\n")
    };
    for reason in &r.reasons {
        out.push_str(&format!("  - {reason}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_lists_its_reasons() {
        let r = OkToStop {
            node: "00000000000000a1".into(),
            name: "gpu07".into(),
            ok: false,
            reasons: vec!["3 stripe(s) would be left with only k shards".into()],
            ..OkToStop::default()
        };
        let text = render(&r);
        assert!(
            text.starts_with("NOT ok to stop gpu07 (00000000000000a1):"),
            "{text}"
        );
        assert!(text.contains("  - 3 stripe(s)"), "{text}");
    }
}
