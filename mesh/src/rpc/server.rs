//! The serving side of [`Transport`]: handlers registered per endpoint, connections and
//! streams accepted (QUIC, and the bulk lane's requests), each request answered or refused.

use super::*;

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A registered handler: the request's bytes in, the encoded response after
/// [`RESPONSE_HEAD`] bytes of room (or a refusal) out.
pub(super) type Handler =
    Arc<dyn Fn(NodeId, Bytes) -> BoxFuture<Result<Vec<u8>, Refusal>> + Send + Sync>;

const MAX_LOGGED_SOURCES: usize = 1024;

impl Transport {
    /// Serves requests of type `M` with `handler` (the caller's node id and the message in,
    /// the response or a refusal out).
    pub fn register<M, F, Fut>(&self, handler: F)
    where
        M: Rpc,
        F: Fn(NodeId, M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Response, Refusal>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: Handler = Arc::new(move |from, body: Bytes| {
            let decoded = M::decode_request(body);
            let handler = handler.clone();
            Box::pin(async move {
                let msg = decoded.map_err(|e| {
                    Refusal::new(
                        FailureClass::Invalid,
                        format!("malformed {}: {e}", M::ENDPOINT),
                    )
                })?;
                let resp = handler(from, msg).await?;
                // Sized first, then encoded once into the frame after room for its head:
                // a shard in the answer is copied once here, not again into the frame nor at
                // every doubling of a growing buffer.
                let size = encoded_len(&resp)
                    .map_err(|e| Refusal::new(FailureClass::Refused, e.to_string()))?;
                let mut frame = Vec::with_capacity(RESPONSE_HEAD + size);
                frame.resize(RESPONSE_HEAD, 0);
                postcard::to_extend(&resp, frame)
                    .map_err(|e| Refusal::new(FailureClass::Refused, e.to_string()))
            })
        });
        self.handlers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(M::ENDPOINT, (M::ENDPOINT, erased));
    }

    /// Accepts connections until the endpoint is closed.
    /// (On the simulated network, the network calls the handlers: nothing to accept.)
    pub fn serve(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let Wire::Quic(endpoint) = &self.wire else {
            return tokio::spawn(async {});
        };
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let this = this.clone();
                tokio::spawn(async move {
                    let remote = incoming.remote_address();
                    match incoming.await {
                        Ok(conn) => match quic_peer(&conn, &this.revocations) {
                            Ok(peer) => this.serve_connection(conn, Arc::new(peer)).await,
                            Err(refused) => {
                                conn.close(refused.code.into(), refused.reason.as_bytes());
                                this.reject(remote, &refused.reason);
                            }
                        },
                        Err(e) => {
                            this.reject(remote, &e.to_string());
                            this.note_revoked(remote, Some(&e));
                        }
                    }
                });
            }
        })
    }

    /// Counts a connection refused (`reason`: the metric's label).
    pub(super) fn count_rejected(&self, reason: &'static str) {
        self.metrics
            .rpc_connections_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub(super) fn reject(&self, remote: SocketAddr, reason: &str) {
        self.count_rejected("handshake");
        let mut logged = self
            .logged_sources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.len() < MAX_LOGGED_SOURCES && logged.insert(remote.ip()) {
            warn!(%remote, %reason, "rejected a QUIC or bulk connection (logged once per source)");
        }
    }

    /// Counts (and logs once per source) a bulk connection dropped before it was served.
    pub(super) fn reject_bulk(&self, remote: SocketAddr, why: Rejection) {
        let reason = match why {
            Rejection::Handshake(e) => return self.reject(remote, &e),
            Rejection::Crowded(c) => c.reason(),
            Rejection::Timeout => "handshake_timeout",
            Rejection::Busy => "authenticated_limit",
        };
        self.metrics
            .bulk_connections_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
        let mut logged = self
            .bulk_logged_sources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.len() < MAX_LOGGED_SOURCES && logged.insert(remote.ip()) {
            warn!(%remote, reason, "dropped a bulk lane connection before it was served (logged once per source)");
        }
    }

    pub(super) async fn serve_connection(
        self: Arc<Self>,
        conn: quinn::Connection,
        peer: Arc<NodeCert>,
    ) {
        loop {
            match conn.accept_bi().await {
                Ok((send, recv)) => {
                    let (this, peer) = (self.clone(), peer.clone());
                    tokio::spawn(async move { this.serve_stream(send, recv, &peer).await });
                }
                Err(e) => {
                    debug!(remote = %conn.remote_address(), error = %e, "connection closed");
                    self.note_revoked(conn.remote_address(), Some(&e));
                    return;
                }
            }
        }
    }

    pub(super) async fn serve_stream(
        self: Arc<Self>,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
        peer: &NodeCert,
    ) {
        let request = match recv.read_to_end(MAX_MESSAGE).await {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, "request read failed");
                return;
            }
        };
        let frame = self.answer(request.into(), peer, Lane::Quic).await;
        if let Err(e) = send.write_all(&frame).await {
            debug!(error = %e, "response write failed");
            return;
        }
        let _ = send.finish();
        // Wait for the peer to read the response before the stream is dropped.
        let _ = send.stopped().await;
    }

    /// Serves one framed request from `peer` on `lane`: dispatch, count, and frame the
    /// response.
    pub(crate) async fn answer(&self, request: Bytes, peer: &NodeCert, lane: Lane) -> Vec<u8> {
        let (status, body, endpoint) = self.dispatch(request, peer, lane).await;
        if let Some(endpoint) = endpoint {
            let outcome = if status == STATUS_OK { "ok" } else { "error" };
            self.metrics
                .rpc_requests
                .get_or_create(&RpcLabel {
                    endpoint,
                    side: "server",
                    outcome,
                })
                .inc();
        }
        // A handler's answer comes with room for the head (it may be a shard, not copied
        // again here); the short refusals are copied behind one.
        let mut frame = if status == STATUS_OK {
            body
        } else {
            with_head(body)
        };
        if let Some(head) = frame.get_mut(..RESPONSE_HEAD) {
            head.copy_from_slice(&[RPC_VERSION, status]);
        }
        frame
    }

    /// Counts a request refused before its handler, and the refusal to send back.
    pub(super) fn refuse(
        &self,
        reason: &'static str,
        message: String,
    ) -> (u8, Vec<u8>, Option<&'static str>) {
        self.metrics
            .rpc_requests_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
        debug!(reason, %message, "refused a request");
        (
            STATUS_ERROR,
            Refusal::new(FailureClass::Refused, message).encode(),
            None,
        )
    }

    /// The status and body of the answer to `request` (with `STATUS_OK`, the body after
    /// room for the response head), and the endpoint when one was found.
    pub(super) async fn dispatch(
        &self,
        request: Bytes,
        peer: &NodeCert,
        lane: Lane,
    ) -> (u8, Vec<u8>, Option<&'static str>) {
        let (head, body) = match postcard::take_from_bytes::<RequestHead>(&request) {
            Ok((head, body)) => (head, request.slice_ref(body)),
            Err(e) => {
                let r = Refusal::new(
                    FailureClass::Invalid,
                    format!("malformed request head: {e}"),
                );
                return (STATUS_ERROR, r.encode(), None);
            }
        };
        if head.version != RPC_VERSION {
            let msg = format!("unsupported RPC version {}", head.version);
            return (
                STATUS_ERROR,
                Refusal::new(FailureClass::Invalid, msg).encode(),
                None,
            );
        }
        // The connection proved the peer's certificate; the request may speak only for
        // the node that certificate names, and only while the cluster has not revoked it.
        if head.from != peer.node {
            return self.refuse(
                "impersonation",
                format!(
                    "claims to be node {} but its certificate is node {} ({})",
                    head.from, peer.node, peer.name
                ),
            );
        }
        if self.revocations.is_revoked(peer) {
            return self.refuse(
                "revoked",
                format!("the certificate of {} is revoked", peer.name),
            );
        }
        if let Lane::Bulk = lane {
            let filter = self
                .bulk_endpoints
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(head.endpoint.as_str())
                .copied();
            if !filter.is_some_and(|allow| allow(&body)) {
                return self.refuse(
                    "lane",
                    format!("{} is not served on the bulk lane", head.endpoint),
                );
            }
        }
        let found = self
            .handlers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(head.endpoint.as_str())
            .cloned();
        let Some((name, handler)) = found else {
            let msg = format!("no handler for {}", head.endpoint);
            return (STATUS_NO_HANDLER, msg.into_bytes(), None);
        };
        match handler(head.from, body).await {
            Ok(resp) => (STATUS_OK, resp, Some(name)),
            Err(refusal) => (STATUS_ERROR, refusal.encode(), Some(name)),
        }
    }
}
