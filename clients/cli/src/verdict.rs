//! What a ledger verification found when it ran to its end: [`Broken`], where the ledger (or
//! the chain of checkpoints vouching for it) does not hold. A verification answers
//! `anyhow::Result<Result<T, Broken>>`: the outer error is "could not run" (the server did not
//! answer, a record is malformed), the inner one the finding, which is the command's verdict
//! and not a failure of the tool. Each variant's message says what was altered and where.

use signet_types::ledger::{ChainBreak, Hash};

/// Where a verified ledger breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Broken {
    /// The hash chain itself does not link ([`signet_types::ledger::Verifier`]'s finding).
    #[error(transparent)]
    Chain(#[from] ChainBreak),
    /// A revocation event names a row no event named when the events were first read.
    #[error(
        "event {event}: row {row} was not named by any event when the events were first read \
         (the events changed during the verification)"
    )]
    RowNotNamed { event: u64, row: u64 },
    /// A revocation event names a row that is not a certificate.
    #[error("event {event}: row {row} is not a certificate row")]
    NotACertificateRow { event: u64, row: u64 },
    /// A revocation event names a certificate row whose serial or hash is not the event's.
    #[error("event {event}: row {row} is not the certificate with serial {serial} it names")]
    NotTheNamedCertificate {
        event: u64,
        row: u64,
        serial: String,
    },
    /// The chain's hash at an expected row (a checkpoint's, `--expect-head`) is another.
    #[error(
        "row {seq}: the chain's hash there is {}, but {what} says {}: the history up to \
         row {seq} was rewritten (and the chain recomputed after it)",
        hex::encode(.found),
        hex::encode(.expected)
    )]
    Rewritten {
        seq: u64,
        found: Hash,
        /// The expectation (a checkpoint, `--expect-head …`).
        what: String,
        expected: Hash,
    },
    /// An expectation at row 0 whose hash is not the empty ledger's.
    #[error("{what} names row 0 with a hash that is not the empty ledger's")]
    NotGenesis { what: String },
    /// The chain ends before an expected row: its tail was deleted.
    #[error(
        "the chain ends at row {last}, before row {seq} of {what}: rows {}..={seq} were \
         deleted (a truncated tail)",
        .last + 1
    )]
    Truncated { last: u64, seq: u64, what: String },
    /// Two checkpoints in signing order whose seq went back.
    #[error(
        "the checkpoints went back: {newer} is at row {newer_seq}, below {older} at row \
         {older_seq} signed before it: the ledger's head was moved back between them (rows \
         deleted)"
    )]
    CheckpointsWentBack {
        older: String,
        older_seq: u64,
        newer: String,
        newer_seq: u64,
    },
    /// Two checkpoints of one row with different hashes.
    #[error(
        "{older} and {newer} are both at row {seq} with different hashes: the ledger's history \
         up to it was rewritten between them"
    )]
    CheckpointsDisagree {
        older: String,
        newer: String,
        seq: u64,
    },
    /// A version 2 checkpoint that extends a row below the checkpoint signed before it.
    #[error(
        "{newer} names as the checkpoint it extends row {previous_seq}, but {older} at row \
         {older_seq} was signed before it: it was signed without extending that one (the \
         ledger was rolled back and a server without a record of the later checkpoint signed)"
    )]
    CheckpointNotExtended {
        newer: String,
        previous_seq: u64,
        older: String,
        older_seq: u64,
    },
    /// A version 2 checkpoint that extends the row of the one before it with another hash.
    #[error(
        "{newer} names as the checkpoint it extends row {seq} with hash {}, but {older} has \
         hash {} there: the history up to it was rewritten",
        hex::encode(.previous_hash),
        hex::encode(.older_hash)
    )]
    CheckpointExtendsRewritten {
        newer: String,
        seq: u64,
        previous_hash: Hash,
        older: String,
        older_hash: Hash,
    },
    /// A checkpoint's row is held with another hash.
    #[error(
        "row {seq}: the ledger's hash there is {}, but {what} says {}: the history up to row \
         {seq} was rewritten",
        hex::encode(.held),
        hex::encode(.says)
    )]
    CheckpointRowRewritten {
        seq: u64,
        held: Hash,
        what: String,
        says: Hash,
    },
    /// A finding at the row of a checkpoint (`what`).
    #[error("{finding} ({what} is at that row)")]
    AtCheckpointRow { finding: Box<Broken>, what: String },
    /// A certificate row whose hash is not what it stores.
    #[error("row {seq} does not hash to what it stores (altered)")]
    RowAltered { seq: u64 },
    /// An event row whose hash is not what it stores.
    #[error("row {seq} (an event) does not hash to what it stores (altered)")]
    EventAltered { seq: u64 },
    /// A row the chain needs is not in the ledger.
    #[error("row {seq} is gone from the ledger (deleted)")]
    RowGone { seq: u64 },
    /// A certificate row whose stored certificate is not the one its entry hashes.
    #[error("row {seq}: the stored certificate does not match its recorded SHA-256 (altered)")]
    CertificateAltered { seq: u64 },
    /// A revocation event names a serial no certificate row has.
    #[error("event {event}: no certificate row with serial {serial} (it names row {row})")]
    EventNamesNoRow {
        event: u64,
        serial: String,
        row: u64,
    },
    /// A revocation event names a row that does not hash to what it stores.
    #[error("event {event}: row {row} (serial {serial}) does not hash to what it stores (altered)")]
    NamedRowAltered {
        event: u64,
        row: u64,
        serial: String,
    },
    /// A row a revocation event names whose revocation column was cleared.
    #[error(
        "row {row} (serial {serial}) is revoked by a ledger event, but the database no longer \
         marks it revoked (altered): CRLs and renewals do not see the revocation; revoke it \
         again (`signetctl certs revoke {serial}`)"
    )]
    RevocationCleared { row: u64, serial: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_read_as_before() {
        let what = "--expect-head 5:0707".to_owned();
        assert_eq!(
            Broken::Truncated {
                last: 3,
                seq: 5,
                what: what.clone()
            }
            .to_string(),
            "the chain ends at row 3, before row 5 of --expect-head 5:0707: rows 4..=5 were \
             deleted (a truncated tail)"
        );
        let found = [1u8; 32];
        let expected = [7u8; 32];
        assert_eq!(
            Broken::Rewritten {
                seq: 5,
                found,
                what,
                expected
            }
            .to_string(),
            format!(
                "row 5: the chain's hash there is {}, but --expect-head 5:0707 says {}: the \
                 history up to row 5 was rewritten (and the chain recomputed after it)",
                hex::encode(found),
                hex::encode(expected)
            )
        );
        assert_eq!(
            Broken::NotTheNamedCertificate {
                event: 9,
                row: 3,
                serial: "0c".into()
            }
            .to_string(),
            "event 9: row 3 is not the certificate with serial 0c it names"
        );
    }
}
