//! Entry points for the fuzz targets (`tests/fuzz`) and their corpus replay: every decoder
//! of bytes that arrive from the network. Each must return, never panic, whatever the bytes.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Instant;

use crate::envelope::{self, ReplayGuard};
use crate::facts::{NodeFacts, NodeRole};
use crate::identity::{MemberId, NodeId};
use crate::membership::{Membership, MembershipConfig};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

thread_local! {
    static MEMBER: RefCell<Option<Membership>> = const { RefCell::new(None) };
    static GUARD: RefCell<ReplayGuard> = RefCell::new(ReplayGuard::default());
}

fn member() -> Membership {
    let me = MemberId {
        node: NodeId(1),
        addr: addr(7946),
        generation: 1,
    };
    let facts = NodeFacts {
        node: NodeId(1),
        generation: 1,
        seq: 0,
        name: "fuzz".into(),
        failure_domain: "fd".into(),
        rpc_addr: addr(7947),
        bulk_addr: None,
        capacity_bytes: 1,
        used_bytes: 0,
        role: NodeRole::Active,
        agent_version: "0".into(),
        store_accepting: true,
        store_room_bytes: 1,
        repair_bytes_per_sec: 0,
        store_opening: false,
        meta_failed: false,
    };
    match Membership::new(me, facts, &MembershipConfig::default(), 7) {
        Ok((m, _)) => m,
        Err(e) => panic!("a member for fuzzing: {e}"),
    }
}

/// A gossip datagram: the envelope, and (as if it had been authentic) its payload into
/// SWIM and the facts decoder.
pub fn gossip(bytes: &[u8]) {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[7; 32]);
    if let Ok(opened) = envelope::open(&key, bytes, true)
        && let Some(s) = opened.sender
    {
        GUARD.with_borrow_mut(|g| g.admit(&s));
    }
    let _ = NodeFacts::decode(bytes);
    MEMBER.with_borrow_mut(|m| {
        let m = m.get_or_insert_with(member);
        let _ = m.handle_data(addr(9000), bytes, Instant::now());
    });
}

/// An RPC request frame (head, then message) and a response frame, as the transport splits
/// them, and the refusal text of an error answer.
pub fn rpc(bytes: &[u8]) {
    let _ = crate::rpc::split_request(bytes);
    let _ = crate::rpc::split_response(bytes);
}

/// The bulk lane's frames as a reader takes them off a connection, in both modes.
pub fn bulk(bytes: &[u8]) {
    thread_local! {
        static RT: Option<tokio::runtime::Runtime> = tokio::runtime::Builder::new_current_thread().build().ok();
    }
    RT.with(|rt| {
        if let Some(rt) = rt {
            rt.block_on(crate::bulk::read_frames(bytes));
        }
    });
}
