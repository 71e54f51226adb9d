//! What the server tells its client unasked: that a request one of its sagas waits on was
//! decided. Sent as `notifications/message`, the one notification of protocol versions
//! 2025-06-18 and 2025-11-25 a client takes without subscribing to anything. rmcp marks
//! logging deprecated (SEP-2577, a later version of the protocol): this module is the only
//! place that uses it, so that a replacement lands here alone.
#![allow(deprecated)]

use rmcp::RoleServer;
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, ServerCapabilities};
use rmcp::service::{Peer, ServiceError};
use serde_json::Value;

use crate::SERVER_NAME;

/// What the server offers: its tools, and the messages [`tell`] sends.
pub(crate) fn capabilities() -> ServerCapabilities {
    ServerCapabilities::builder()
        .enable_tools()
        .enable_logging()
        .build()
}

/// Sends `data` to the client as a message of level `notice` from logger `agent-kernel`.
pub(crate) async fn tell(peer: &Peer<RoleServer>, data: Value) -> Result<(), ServiceError> {
    peer.notify_logging_message(
        LoggingMessageNotificationParam::new(LoggingLevel::Notice, data).with_logger(SERVER_NAME),
    )
    .await
}
