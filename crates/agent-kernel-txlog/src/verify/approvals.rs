//! Replaying the records of approval requests, by the rules the write path keeps
//! (`transitions`).

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::transitions::{CONSUMED_FROM, decided_from};

impl Replay {
    pub(super) fn approval_requested(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
    ) -> Result<(), String> {
        self.saga_mut(saga_id)?;
        let approval_id = body.str("approval_id")?.to_owned();
        let exists = self
            .approvals
            .contains(&self.scratch, &id_key(&approval_id));
        if self.scratch.noted(exists)? {
            return Err(format!(
                "it requests approval {approval_id}, which already exists"
            ));
        }
        let model = ApprovalModel {
            last_seq: seq,
            saga_id: saga_id.to_owned(),
            step_seq: body.int("step_seq")?,
            tool_id: body.str("tool")?.to_owned(),
            args_sha256: body.str("args_sha256")?.to_owned(),
            idempotency_key: body.opt_str("idempotency_key")?,
            digest: body.str("digest")?.to_owned(),
            rest_sha256: body.opt_str("rest_sha256")?,
            status: ApprovalStatus::Pending.as_str().to_owned(),
            requested_at_ms: body.int("requested_at_ms")?,
            expires_at_ms: body.int("expires_at_ms")?,
            decided_at_ms: None,
            decided_by: None,
            note_sha256: None,
            decision_seq: None,
            operator_key_check: body.opt_str("operator_key_check")?,
        };
        Self::put_new(
            &mut self.scratch,
            &mut self.approvals,
            id_key(&approval_id),
            model,
        )
    }

    /// A decision, from a status [`decided_from`] allows for it.
    pub(super) fn approval_decided(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
        at_ms: i64,
    ) -> Result<(), String> {
        body.object("by")?;
        let status: ApprovalStatus = body.parsed("status")?;
        let note_sha256 = body.opt_str("note_sha256")?;
        let decided_by = body.opt_str("decided_by")?;
        let digest = body.str("digest")?.to_owned();
        let approval = self.approval_mut(body.str("approval_id")?, saga_id)?;
        if approval.digest != digest {
            return Err(format!(
                "it decides on digest {digest}, but the request names {}",
                approval.digest
            ));
        }
        let open = decided_from(status)
            .iter()
            .any(|from| approval.status == from.as_str());
        if !open {
            return Err(format!(
                "it decides {} on a request that was {}",
                status, approval.status
            ));
        }
        approval.status = status.as_str().to_owned();
        approval.decided_at_ms = Some(at_ms);
        approval.decided_by = decided_by;
        approval.note_sha256 = note_sha256;
        approval.decision_seq = Some(seq);
        approval.last_seq = seq;
        Ok(())
    }

    /// A request used by its step's BEGIN: [`CONSUMED_FROM`], for that step and digest.
    pub(super) fn approval_consumed(
        &mut self,
        saga_id: &str,
        body: &Body<'_>,
        seq: i64,
    ) -> Result<(), String> {
        let digest = body.str("digest")?.to_owned();
        let step_seq = body.int("step_seq")?;
        let approval = self.approval_mut(body.str("approval_id")?, saga_id)?;
        if approval.status != CONSUMED_FROM.as_str()
            || approval.digest != digest
            || approval.step_seq != step_seq
        {
            return Err(format!(
                "it uses a request that was {} (digest {}, step {}) for step {step_seq} with digest {digest}",
                approval.status, approval.digest, approval.step_seq
            ));
        }
        approval.status = ApprovalStatus::Consumed.as_str().to_owned();
        approval.last_seq = seq;
        Ok(())
    }
}
