//! The calling side of [`Transport`]: one pooled connection per peer, each call a stream
//! of its own (or a bulk-lane exchange), a timed-out connection taken out of the pool.

use super::*;

impl Transport {
    /// Sends `msg` over QUIC to the peer at `peer` and waits up to `timeout` for its
    /// response.
    pub async fn call<M: Rpc>(
        &self,
        peer: SocketAddr,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        self.call_on(Route::Quic(peer), None, msg, timeout).await
    }

    /// Like [`Transport::call`], to the node `node` at `peer`: refused unless the peer's
    /// certificate names that node (an address gossip got wrong, or a node holding
    /// another's address, is never sent what was meant for `node`).
    pub async fn call_to<M: Rpc>(
        &self,
        node: NodeId,
        peer: SocketAddr,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        self.call_on(Route::Quic(peer), Some(node), msg, timeout)
            .await
    }

    /// Like [`Transport::call_to`], over the TCP bulk lane to the node's bulk address
    /// `bulk`; over QUIC to its RPC address `rpc` when this node runs no bulk lane, or
    /// when that lane cannot connect (its port refuses or drops the connection before the
    /// handshake ends, or says it is busy, or nothing answers within the handshake
    /// deadline: e.g. someone floods the port). A request already sent on the lane is not
    /// sent again over QUIC: its failure is the call's.
    pub async fn call_bulk<M: Rpc>(
        &self,
        node: NodeId,
        rpc: SocketAddr,
        bulk: SocketAddr,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        let route = if self.has_bulk() {
            Route::Bulk { bulk, quic: rpc }
        } else {
            Route::Quic(rpc)
        };
        self.call_on(route, Some(node), msg, timeout).await
    }

    pub(super) async fn call_on<M: Rpc>(
        &self,
        route: Route,
        node: Option<NodeId>,
        msg: &M,
        timeout: Duration,
    ) -> Result<M::Response, MeshError> {
        let started = Instant::now();
        let call = self.call_inner(route, node, msg);
        let res = match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(MeshError::RpcTimeout {
                endpoint: M::ENDPOINT,
                peer: route.first(),
            }),
        };
        if let Err(MeshError::RpcTimeout { peer, .. } | MeshError::RpcStream { peer, .. }) = &res {
            // The peer may have restarted behind a connection that has not timed out yet:
            // the next call dials afresh.
            match (route, self.bulk.get()) {
                (Route::Bulk { bulk, .. }, Some(b)) if *peer == bulk => b.forget(bulk).await,
                _ => self.forget_peer(*peer).await,
            }
        }
        let outcome = if res.is_ok() { "ok" } else { "error" };
        self.metrics
            .rpc_requests
            .get_or_create(&RpcLabel {
                endpoint: M::ENDPOINT,
                side: "client",
                outcome,
            })
            .inc();
        if res.is_ok() {
            self.metrics
                .rpc_latency_seconds
                .get_or_create(&EndpointLabel {
                    endpoint: M::ENDPOINT,
                })
                .observe(started.elapsed().as_secs_f64());
        }
        res
    }

    pub(super) async fn call_inner<M: Rpc>(
        &self,
        route: Route,
        node: Option<NodeId>,
        msg: &M,
    ) -> Result<M::Response, MeshError> {
        let stream_err = |peer: SocketAddr, reason: String| MeshError::RpcStream {
            endpoint: M::ENDPOINT,
            peer,
            reason,
        };
        let head = RequestHead {
            version: RPC_VERSION,
            endpoint: M::ENDPOINT.to_owned(),
            from: self.me,
        };
        // Sized first, then encoded once: a shard in the request is copied once, not again
        // at every doubling of a growing buffer.
        let sized = |e: postcard::Error| stream_err(route.first(), e.to_string());
        let size = encoded_len(&head).map_err(sized)? + encoded_len(msg).map_err(sized)?;
        let request = postcard::to_extend(&head, Vec::with_capacity(size)).map_err(sized)?;
        let request = postcard::to_extend(msg, request).map_err(sized)?;
        if request.len() > MAX_MESSAGE {
            return Err(MeshError::MessageTooLarge {
                endpoint: M::ENDPOINT,
                bytes: request.len(),
                max: MAX_MESSAGE,
            });
        }
        let request = &request[..];
        let quic = |peer: SocketAddr| async move {
            let answer = self.exchange(peer, node, request).await;
            let answer = answer.map_err(|e| match e {
                QuicFailure::Connect(e) => e,
                QuicFailure::Stream(reason) => stream_err(peer, reason),
            });
            answer.map(|r| (peer, r))
        };
        let (peer, response) = match (route, self.bulk.get()) {
            (Route::Bulk { bulk, quic: rpc }, Some(lane)) => {
                match lane.exchange(bulk, node, request).await {
                    Ok(r) => (bulk, r),
                    // Nothing was sent: the same request goes over QUIC (the lane logged
                    // why when it first failed).
                    Err(BulkFailure::Unavailable(e)) => {
                        self.metrics.bulk_fallbacks.inc();
                        debug!(%bulk, %rpc, error = %e, endpoint = M::ENDPOINT, "bulk lane unavailable; sending over QUIC");
                        quic(rpc).await?
                    }
                    Err(BulkFailure::Failed(e)) => return Err(stream_err(bulk, e.to_string())),
                }
            }
            (Route::Bulk { quic: rpc, .. }, None) | (Route::Quic(rpc), _) => quic(rpc).await?,
        };
        let response = Bytes::from(response);
        match split_response(&response) {
            Ok(Ok(body)) => M::decode_response(response.slice_ref(body))
                .map_err(|e| MeshError::RpcDecode(e.to_string())),
            Ok(Err(refusal)) => Err(MeshError::RpcRemote {
                endpoint: M::ENDPOINT,
                peer,
                class: refusal.class,
                message: refusal.message,
            }),
            Err(e) => Err(MeshError::RpcDecode(e)),
        }
    }

    /// One request to `peer` and its answer, on the wire this endpoint has.
    pub(super) async fn exchange(
        &self,
        peer: SocketAddr,
        node: Option<NodeId>,
        request: &[u8],
    ) -> Result<Vec<u8>, QuicFailure> {
        match &self.wire {
            Wire::Quic(endpoint) => self.exchange_quic(endpoint, peer, node, request).await,
            Wire::Sim { net, addr, closed } => {
                if closed.load(std::sync::atomic::Ordering::Acquire) {
                    return Err(QuicFailure::Connect(MeshError::RpcConnect {
                        peer,
                        reason: "this endpoint is closed".into(),
                    }));
                }
                net.exchange(self.me, *addr, peer, node, request).await
            }
        }
    }

    /// One request on a fresh bidirectional stream of the pooled connection to `peer`.
    pub(super) async fn exchange_quic(
        &self,
        endpoint: &quinn::Endpoint,
        peer: SocketAddr,
        node: Option<NodeId>,
        request: &[u8],
    ) -> Result<Vec<u8>, QuicFailure> {
        let (conn, cert) = self
            .connection(endpoint, peer)
            .await
            .map_err(QuicFailure::Connect)?;
        if let Some(node) = node.filter(|n| *n != cert.node) {
            return Err(QuicFailure::Connect(MeshError::RpcConnect {
                peer,
                reason: format!(
                    "expected node {node} there, its certificate is node {} ({})",
                    cert.node, cert.name
                ),
            }));
        }
        if self.revocations.is_revoked(&cert) {
            self.forget(peer, &conn).await;
            return Err(QuicFailure::Connect(MeshError::RpcConnect {
                peer,
                reason: format!("the certificate of {} is revoked", cert.name),
            }));
        }
        let (mut send, mut recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => {
                self.forget(peer, &conn).await;
                self.note_revoked(peer, conn.close_reason().as_ref());
                return Err(QuicFailure::Stream(e.to_string()));
            }
        };
        let exchanged = async {
            send.write_all(request).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            recv.read_to_end(MAX_MESSAGE)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        if exchanged.is_err() {
            self.note_revoked(peer, conn.close_reason().as_ref());
        }
        exchanged.map_err(QuicFailure::Stream)
    }

    /// When `peer` closed a connection (`closed`: why) because it refuses this node's
    /// certificate as revoked, says so in the log (at most every [`REVOKED_LOG_EVERY`]) and
    /// counts it.
    pub(super) fn note_revoked(&self, peer: SocketAddr, closed: Option<&quinn::ConnectionError>) {
        let Some(quinn::ConnectionError::ApplicationClosed(close)) = closed else {
            return;
        };
        if close.error_code != quinn::VarInt::from_u32(CLOSE_REVOKED) {
            return;
        }
        self.count_rejected("own_revoked");
        let mut last = self
            .revoked_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < REVOKED_LOG_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        tracing::error!(
            %peer,
            reason = %String::from_utf8_lossy(&close.reason),
            "a peer refuses this node's certificate as revoked: issue a new one with `shoal cert issue --node-id {}` and restart",
            self.me
        );
    }

    pub(super) async fn connection(
        &self,
        endpoint: &quinn::Endpoint,
        peer: SocketAddr,
    ) -> Result<(quinn::Connection, Arc<NodeCert>), MeshError> {
        if let Some(c) = self
            .connections
            .lock()
            .await
            .get(&peer)
            .filter(|(c, _)| c.close_reason().is_none())
        {
            return Ok(c.clone());
        }
        // Dial without holding the table: a dead peer's handshake must not stall calls to
        // every other peer.
        let connect_err = |reason: String| MeshError::RpcConnect { peer, reason };
        let connecting = endpoint
            .connect(peer, &self.server_name)
            .map_err(|e| connect_err(e.to_string()))?;
        let conn = match connecting.await {
            Ok(c) => c,
            Err(e) => {
                self.note_revoked(peer, Some(&e));
                self.count_rejected("outgoing");
                return Err(connect_err(e.to_string()));
            }
        };
        let cert = match quic_peer(&conn, &self.revocations) {
            Ok(c) => Arc::new(c),
            Err(refused) => {
                conn.close(refused.code.into(), refused.reason.as_bytes());
                self.count_rejected("outgoing");
                return Err(connect_err(refused.reason));
            }
        };
        let mut conns = self.connections.lock().await;
        match conns.get(&peer).filter(|(c, _)| c.close_reason().is_none()) {
            // Another call connected meanwhile: use one connection per peer.
            Some(existing) => Ok(existing.clone()),
            None => {
                conns.insert(peer, (conn.clone(), cert.clone()));
                Ok((conn, cert))
            }
        }
    }

    /// Takes the pooled connection to `peer` out of the pool, so the next call dials
    /// afresh. It is not closed: other calls may still be under way on it (closing would
    /// cut them off with "connection lost"); it closes once the last of them drops it.
    pub(super) async fn forget_peer(&self, peer: SocketAddr) {
        self.connections.lock().await.remove(&peer);
    }

    pub(super) async fn forget(&self, peer: SocketAddr, conn: &quinn::Connection) {
        let mut conns = self.connections.lock().await;
        if conns
            .get(&peer)
            .is_some_and(|(c, _)| c.stable_id() == conn.stable_id())
        {
            conns.remove(&peer);
        }
    }
}
