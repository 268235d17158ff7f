//! [`SimNet`]: the network of the simulator (`tests/sim`). Every [`Transport`] of a
//! simulated cluster is attached to one `SimNet` instead of a QUIC endpoint; a call
//! carries the same request frame the wire would (head, postcard body) to the peer's
//! dispatch, and its answer back, with what the simulator's schedule asks for on the way:
//! a delay, a loss, a duplicate, or a partition (one-way or both ways) that loses every
//! message between two nodes while it lasts.
//!
//! Gossip's datagrams ride the same network ([`SimSocket`]): lost, delayed and cut off the
//! same way, never duplicated.
//!
//! A lost message is never answered: the caller's own timeout ends the call, as on a real
//! network. A node that is not attached (killed, not yet started) refuses the connection.
//! The peer's handler runs on a task of its own, so a caller that gives up does not stop
//! work already under way at the peer (as with a real server).
//!
//! Randomness comes from the source the simulator gives (its seeded generator), so a
//! schedule replays exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::MeshError;
use crate::identity::NodeId;
use crate::node_cert::NodeCert;
use crate::rpc::{Lane, QuicFailure, Transport};

/// What happens to messages on the simulated network (each message draws on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// Each message (request or answer) takes between these many microseconds.
    pub delay_us: (u64, u64),
    /// Per million messages: lost.
    pub lost_ppm: u32,
    /// Per million requests: delivered twice (the second answer is thrown away).
    pub duplicated_ppm: u32,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            delay_us: (50, 500),
            lost_ppm: 0,
            duplicated_ppm: 0,
        }
    }
}

type Inbox = tokio::sync::mpsc::UnboundedSender<(SocketAddr, Vec<u8>)>;

/// The simulator's source of random numbers.
pub type Random = Box<dyn FnMut() -> u64 + Send>;

struct Net {
    nodes: BTreeMap<SocketAddr, Weak<Transport>>,
    /// Gossip sockets: where their datagrams go.
    sockets: BTreeMap<SocketAddr, Inbox>,
    /// (from, to) hosts: every message from `from` to `to` is lost.
    cut: BTreeSet<(IpAddr, IpAddr)>,
    faults: Faults,
    random: Random,
    delivered: u64,
    lost: u64,
}

/// One simulated network (see the module's docs).
pub struct SimNet(Mutex<Net>);

/// What one message draws: when it arrives, and whether it is lost or sent twice.
struct Draw {
    delay: Duration,
    lost: bool,
    duplicated: bool,
}

impl SimNet {
    pub fn new(random: Random) -> Arc<SimNet> {
        Arc::new(SimNet(Mutex::new(Net {
            nodes: BTreeMap::new(),
            sockets: BTreeMap::new(),
            cut: BTreeSet::new(),
            faults: Faults::default(),
            random,
            delivered: 0,
            lost: 0,
        })))
    }

    fn net(&self) -> std::sync::MutexGuard<'_, Net> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_faults(&self, faults: Faults) {
        self.net().faults = faults;
    }

    /// Loses every message from host `from` to host `to` until [`SimNet::heal`].
    pub fn cut(&self, from: IpAddr, to: IpAddr) {
        self.net().cut.insert((from, to));
    }

    /// Ends every partition.
    pub fn heal(&self) {
        self.net().cut.clear();
    }

    /// Messages delivered and lost so far.
    pub fn counts(&self) -> (u64, u64) {
        let n = self.net();
        (n.delivered, n.lost)
    }

    pub(crate) fn attach(&self, addr: SocketAddr, transport: &Arc<Transport>) {
        self.net().nodes.insert(addr, Arc::downgrade(transport));
    }

    /// Takes `transport` off the network (a newer one at the same address stays).
    pub(crate) fn detach(&self, addr: SocketAddr, transport: &Transport) {
        let mut n = self.net();
        if n.nodes
            .get(&addr)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), transport))
        {
            n.nodes.remove(&addr);
        }
    }

    fn draw(&self, from: SocketAddr, to: SocketAddr, request: bool) -> Draw {
        let mut n = self.net();
        let f = n.faults;
        let span = f.delay_us.1.saturating_sub(f.delay_us.0) + 1;
        let delay = Duration::from_micros(f.delay_us.0 + (n.random)() % span);
        let lost = n.cut.contains(&(from.ip(), to.ip())) || chance(&mut n.random, f.lost_ppm);
        let duplicated = request && chance(&mut n.random, f.duplicated_ppm);
        if lost {
            n.lost += 1;
        } else {
            n.delivered += 1;
        }
        Draw {
            delay,
            lost,
            duplicated,
        }
    }

    fn peer(&self, addr: SocketAddr) -> Option<Arc<Transport>> {
        self.net().nodes.get(&addr).and_then(Weak::upgrade)
    }

    /// Carries `request` from `from` (at `from_addr`) to the node at `to` (which must be
    /// `node` when given) and its answer back.
    pub(crate) async fn exchange(
        &self,
        from: NodeId,
        from_addr: SocketAddr,
        to: SocketAddr,
        node: Option<NodeId>,
        request: &[u8],
    ) -> Result<Vec<u8>, QuicFailure> {
        let there = self.draw(from_addr, to, true);
        tokio::time::sleep(there.delay).await;
        let Some(peer) = self.peer(to) else {
            return Err(QuicFailure::Connect(MeshError::RpcConnect {
                peer: to,
                reason: "connection refused: nothing runs there".into(),
            }));
        };
        if let Some(node) = node.filter(|n| *n != peer.node()) {
            return Err(QuicFailure::Connect(MeshError::RpcConnect {
                peer: to,
                reason: format!("expected node {node} there, it is node {}", peer.node()),
            }));
        }
        if there.lost {
            return std::future::pending().await;
        }
        let cert = NodeCert {
            node: from,
            name: format!("sim-{from}"),
            issued_ms: 0,
        };
        if there.duplicated {
            let (peer, cert, request) = (peer.clone(), cert.clone(), request.to_vec());
            tokio::spawn(async move { peer.answer(request.into(), &cert, Lane::Quic).await });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let request = request.to_vec();
        tokio::spawn(async move {
            let _ = tx.send(peer.answer(request.into(), &cert, Lane::Quic).await);
        });
        let answer = rx
            .await
            .map_err(|_| QuicFailure::Stream("connection lost".into()))?;
        let back = self.draw(to, from_addr, false);
        if back.lost {
            return std::future::pending().await;
        }
        tokio::time::sleep(back.delay).await;
        Ok(answer)
    }
}

/// A datagram socket on the simulated network: gossip's, in place of its UDP socket.
pub struct SimSocket {
    net: Arc<SimNet>,
    addr: SocketAddr,
    inbox: tokio::sync::mpsc::UnboundedReceiver<(SocketAddr, Vec<u8>)>,
    /// The sender this socket registered (a newer socket at its address replaces it).
    registered: Inbox,
}

impl SimNet {
    /// Binds a datagram socket at `addr` (replacing one a killed node left there).
    pub fn bind_datagrams(self: &Arc<Self>, addr: SocketAddr) -> SimSocket {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.net().sockets.insert(addr, tx.clone());
        SimSocket {
            net: self.clone(),
            addr,
            inbox: rx,
            registered: tx,
        }
    }
}

impl SimSocket {
    /// The next datagram: its length (cut to `buf`) and sender.
    pub async fn recv_from(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        match self.inbox.recv().await {
            Some((from, bytes)) => {
                let len = bytes.len().min(buf.len());
                buf[..len].copy_from_slice(&bytes[..len]);
                Ok((len, from))
            }
            None => std::future::pending().await,
        }
    }

    /// Sends `packet` to `to`: it arrives after the drawn delay, or never.
    pub fn try_send_to(&self, packet: &[u8], to: SocketAddr) -> std::io::Result<usize> {
        let draw = self.net.draw(self.addr, to, false);
        let target = self.net.net().sockets.get(&to).cloned();
        if let (false, Some(target)) = (draw.lost, target) {
            let (from, bytes) = (self.addr, packet.to_vec());
            tokio::spawn(async move {
                tokio::time::sleep(draw.delay).await;
                let _ = target.send((from, bytes));
            });
        }
        Ok(packet.len())
    }
}

impl Drop for SimSocket {
    fn drop(&mut self) {
        let mut n = self.net.net();
        if n.sockets
            .get(&self.addr)
            .is_some_and(|s| s.same_channel(&self.registered))
        {
            n.sockets.remove(&self.addr);
        }
    }
}

/// True `ppm` times in a million.
fn chance(random: &mut Random, ppm: u32) -> bool {
    ppm > 0 && random() % 1_000_000 < u64::from(ppm)
}
