//! `shoal cert`: the cluster CA, the shared gossip secret, and node certificates.
//!
//! Layout written by `init`: `ca.pem`, `ca.key` (0600), `cluster.key` (0600). `issue`
//! writes `node.pem` and `node.key` (0600). The agent's `[tls]` section names these files.
//!
//! A node certificate names its node: the common name is the node's name, and a URI
//! subject alternative name `shoal://node/<id, 16 hex digits>/<issued, unix ms>` its id and
//! issue time. Agents bind every connection to that identity and refuse certificates the
//! cluster revoked (`shoal cert revoke`, by name and issue time).

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, bail};
use rand::RngExt;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use shoal_agent_api::{NODE_TLS_NAME, Request, Response};
use time::{Duration, OffsetDateTime};

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const CLUSTER_KEY: &str = "cluster.key";
pub const NODE_CERT: &str = "node.pem";
pub const NODE_KEY: &str = "node.key";

const CA_VALIDITY_DAYS: i64 = 3650;
const NODE_VALIDITY_DAYS: i64 = 825;

/// Creates a new cluster CA and gossip secret in `dir`. Refuses to overwrite an existing CA:
/// regenerating it would cut every node off the cluster.
pub fn init(dir: &Path, cluster_name: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for name in [CA_CERT, CA_KEY, CLUSTER_KEY] {
        if dir.join(name).exists() {
            bail!(
                "{} already exists; refusing to replace the cluster CA (delete it by hand to start a new cluster)",
                dir.join(name).display()
            );
        }
    }
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        DnType::CommonName,
        format!("shoal cluster CA ({cluster_name})"),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(CA_VALIDITY_DAYS);
    let cert = params.self_signed(&key).context("self-signing the CA")?;

    let mut secret = [0u8; 32];
    rand::rng().fill(&mut secret[..]);
    let secret_hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();

    write_file(&dir.join(CA_KEY), key.serialize_pem().as_bytes(), 0o600)?;
    write_file(
        &dir.join(CLUSTER_KEY),
        format!("{secret_hex}\n").as_bytes(),
        0o600,
    )?;
    write_file(&dir.join(CA_CERT), cert.pem().as_bytes(), 0o644)?;
    Ok(())
}

/// The subject alternative name that names node `id`, issued at `issued_ms` (unix
/// milliseconds): what the agents read a peer's identity from (`shoal_mesh::NodeCert`).
fn node_uri(id: u64, issued_ms: u64) -> String {
    format!("{NODE_URI_PREFIX}{id:016x}/{issued_ms}")
}

const NODE_URI_PREFIX: &str = "shoal://node/";

/// A node id as `shoal status` shows it: 16 hex digits, not 0.
pub fn parse_node_id(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    match u64::from_str_radix(t, 16) {
        Ok(id) if t.len() == 16 && id != 0 => Ok(id),
        _ => bail!(
            "--node-id {text:?}: expected 16 hexadecimal digits (not all zero), as `shoal status` shows node ids"
        ),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Issues a certificate for node `name` (id `node`, or a new one), reachable at `ips`,
/// signed by the CA in `ca_dir`; writes it to `out`. Returns the node id.
pub fn issue(
    ca_dir: &Path,
    name: &str,
    ips: &[IpAddr],
    node: Option<u64>,
    out: &Path,
) -> anyhow::Result<u64> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        bail!("--name {name:?}: use letters, digits, '-' and '.' only");
    }
    let read = |f: &str| {
        std::fs::read_to_string(ca_dir.join(f))
            .with_context(|| format!("cannot read {}", ca_dir.join(f).display()))
    };
    let ca_key = KeyPair::from_pem(&read(CA_KEY)?).context("CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&read(CA_CERT)?, ca_key).context("CA certificate")?;

    // 0 is reserved; a random u64 is never expected to collide in a cluster.
    let id = node.unwrap_or_else(|| rand::rng().random_range(1..=u64::MAX));
    let mut params = CertificateParams::new(vec![NODE_TLS_NAME.to_owned(), name.to_owned()])?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.subject_alt_names.push(SanType::URI(
        node_uri(id, now_ms())
            .try_into()
            .context("the node URI is not an IA5 string")?,
    ));
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(NODE_VALIDITY_DAYS);
    let key = KeyPair::generate().context("generating the node key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("signing the node certificate")?;

    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_file(&out.join(NODE_KEY), key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&out.join(NODE_CERT), cert.pem().as_bytes(), 0o644)?;
    Ok(id)
}

/// What a node certificate says of its node.
#[derive(Debug, PartialEq, Eq, serde::Serialize)]
pub struct CertInfo {
    pub name: String,
    /// 16 hex digits; `None` for a certificate of the release before certificates named
    /// their node (agents refuse those: issue it again with `--node-id`).
    pub node_id: Option<String>,
    pub issued_ms: Option<u64>,
    pub not_after: String,
    pub ips: Vec<IpAddr>,
}

/// Reads the node certificate at `path`.
pub fn info(path: &Path) -> anyhow::Result<CertInfo> {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)
        .map_err(|e| anyhow::anyhow!("{}: not a PEM certificate: {e}", path.display()))?;
    let (_, cert) = X509Certificate::from_der(&pem.contents)
        .map_err(|e| anyhow::anyhow!("{}: not a certificate: {e}", path.display()))?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (mut node_id, mut issued_ms, mut ips) = (None, None, Vec::new());
    if let Ok(Some(sans)) = cert.subject_alternative_name() {
        for n in &sans.value.general_names {
            match n {
                GeneralName::URI(u) => {
                    if let Some((id, at)) = u
                        .strip_prefix(NODE_URI_PREFIX)
                        .and_then(|rest| rest.split_once('/'))
                    {
                        node_id = Some(id.to_owned());
                        issued_ms = at.parse().ok();
                    }
                }
                GeneralName::IPAddress(b) => match b.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        name,
        node_id,
        issued_ms,
        not_after: cert.validity().not_after.to_string(),
        ips,
    })
}

/// `shoal cert show`.
pub fn show(path: &Path, json: bool) -> anyhow::Result<()> {
    let i = info(path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&i)?);
        return Ok(());
    }
    println!("name:      {}", i.name);
    match &i.node_id {
        Some(id) => println!("node id:   {id}"),
        None => println!(
            "node id:   none (a certificate of the previous release: agents refuse it; issue it again with --node-id)"
        ),
    }
    if let Some(at) = i.issued_ms {
        println!("issued:    {} ({at} ms since the epoch)", utc_from_ms(at));
    }
    println!("valid to:  {}", i.not_after);
    let ips: Vec<String> = i.ips.iter().map(ToString::to_string).collect();
    println!("addresses: {}", ips.join(", "));
    Ok(())
}

/// `shoal cert revoke NAME`: refuses a name no member carries unless `force` (a typo would
/// otherwise revoke nothing and say it did).
pub fn revoke(socket: &Path, name: String, force: bool) -> anyhow::Result<()> {
    if !force {
        let members = match crate::maintenance::call(socket, Request::Status)? {
            Response::Status(report) => report.nodes,
            other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
        };
        if !members.iter().any(|m| m.name == name) {
            let mut names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
            names.sort_unstable();
            return Err(crate::failure::not_found(format!(
                "no member is named {name:?} (members: {}); to revoke the certificates of a node that left the cluster, add --force",
                names.join(", ")
            )));
        }
    }
    crate::maintenance::change(socket, Request::RevokeCertificate { name }, false)
}

/// A unix time in milliseconds as a UTC date, e.g. "2026-12-02 06:10:48.001 UTC".
pub fn utc_from_ms(ms: u64) -> String {
    let at = i128::from(ms) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(at) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        Err(_) => "beyond the calendar".to_owned(),
    }
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    // The rename is only durable once its directory is.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::utc_from_ms;

    #[test]
    fn issue_times_read_as_utc_dates() {
        assert_eq!(utc_from_ms(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(
            utc_from_ms(1_796_191_848_001),
            "2026-12-02 06:10:48.001 UTC"
        );
        assert_eq!(utc_from_ms(u64::MAX), "beyond the calendar");
    }
}
