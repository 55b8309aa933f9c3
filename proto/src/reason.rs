//! Every reason the platform gives for an error: the `reason` of the
//! standard `google.rpc.ErrorInfo` detail (domain `cellmesh`), stable on the
//! wire. One enum, so a reason is named once and a client can match on it
//! ([`Reason::parse`]); the `code` beside it says what a caller may do.

macro_rules! reasons {
    ($($variant:ident => $wire:literal,)*) => {
        /// A stable, machine-readable error reason.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($variant,)*
        }

        impl Reason {
            /// Every reason, in wire-name order.
            pub const ALL: &[Reason] = &[$(Reason::$variant,)*];

            /// The reason as it travels, e.g. `NO_ROUTE`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $wire,)*
                }
            }

            /// The reason a wire name stands for (`None`: not one of ours,
            /// e.g. `GRPC_UNAVAILABLE` for a status without details).
            pub fn parse(wire: &str) -> Option<Reason> {
                match wire {
                    $($wire => Some(Reason::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

reasons! {
    AttachmentDigestMismatch => "ATTACHMENT_DIGEST_MISMATCH",
    AttachmentInfected => "ATTACHMENT_INFECTED",
    AttachmentNotComplete => "ATTACHMENT_NOT_COMPLETE",
    AttachmentNotFound => "ATTACHMENT_NOT_FOUND",
    AttachmentQuotaExceeded => "ATTACHMENT_QUOTA_EXCEEDED",
    AttachmentSizeMismatch => "ATTACHMENT_SIZE_MISMATCH",
    AttachmentStoreUnavailable => "ATTACHMENT_STORE_UNAVAILABLE",
    AttachmentTooLarge => "ATTACHMENT_TOO_LARGE",
    AwaitingBackfill => "AWAITING_BACKFILL",
    BackupFailed => "BACKUP_FAILED",
    BackupNotFound => "BACKUP_NOT_FOUND",
    BackupRunning => "BACKUP_RUNNING",
    BadAttachmentName => "BAD_ATTACHMENT_NAME",
    BadDeviceId => "BAD_DEVICE_ID",
    BadDigest => "BAD_DIGEST",
    BadHighWaterMark => "BAD_HIGH_WATER_MARK",
    BadReplicatedWrite => "BAD_REPLICATED_WRITE",
    BadSeqList => "BAD_SEQ_LIST",
    BadSignature => "BAD_SIGNATURE",
    BadSourceAddress => "BAD_SOURCE_ADDRESS",
    BodyTooLarge => "BODY_TOO_LARGE",
    CallerMismatch => "CALLER_MISMATCH",
    CertificateRevoked => "CERTIFICATE_REVOKED",
    CheckpointBehind => "CHECKPOINT_BEHIND",
    ChecksumMismatch => "CHECKSUM_MISMATCH",
    ChunkChecksum => "CHUNK_CHECKSUM",
    ClientReqIdReused => "CLIENT_REQ_ID_REUSED",
    ClientReqIdTooLong => "CLIENT_REQ_ID_TOO_LONG",
    ColdTierUnavailable => "COLD_TIER_UNAVAILABLE",
    CommitPending => "COMMIT_PENDING",
    ConcurrentAttemptFailed => "CONCURRENT_ATTEMPT_FAILED",
    ContentTypeNotAllowed => "CONTENT_TYPE_NOT_ALLOWED",
    ConversationIncomplete => "CONVERSATION_INCOMPLETE",
    ConversationNotFound => "CONVERSATION_NOT_FOUND",
    ConversationRateLimited => "CONVERSATION_RATE_LIMITED",
    CoordinationUnavailable => "COORDINATION_UNAVAILABLE",
    CrossTenant => "CROSS_TENANT",
    DirectNeedsTwoMembers => "DIRECT_NEEDS_TWO_MEMBERS",
    EditWindowPassed => "EDIT_WINDOW_PASSED",
    EmptyBody => "EMPTY_BODY",
    EmptyChunk => "EMPTY_CHUNK",
    Frozen => "FROZEN",
    // A failover hold longer than the control plane allows (an hour).
    HoldTooLong => "HOLD_TOO_LONG",
    IllegalTransition => "ILLEGAL_TRANSITION",
    InvalidRouteCommand => "INVALID_ROUTE_COMMAND",
    InvalidUserId => "INVALID_USER_ID",
    MalformedRequest => "MALFORMED_REQUEST",
    MalformedToken => "MALFORMED_TOKEN",
    MessageNotFound => "MESSAGE_NOT_FOUND",
    MessageRecalled => "MESSAGE_RECALLED",
    MissingClientReqId => "MISSING_CLIENT_REQ_ID",
    MissingConversationId => "MISSING_CONVERSATION_ID",
    MissingId => "MISSING_ID",
    MissingSeq => "MISSING_SEQ",
    MissingSpec => "MISSING_SPEC",
    MissingToken => "MISSING_TOKEN",
    NotADeploymentComponent => "NOT_A_DEPLOYMENT_COMPONENT",
    NotAGroup => "NOT_A_GROUP",
    NotAMember => "NOT_A_MEMBER",
    NotAStandby => "NOT_A_STANDBY",
    NotConversationAdmin => "NOT_CONVERSATION_ADMIN",
    NotFrozen => "NOT_FROZEN",
    NotLeader => "NOT_LEADER",
    NotMovingHere => "NOT_MOVING_HERE",
    NotOwner => "NOT_OWNER",
    NotPausable => "NOT_PAUSABLE",
    NotSender => "NOT_SENDER",
    NoCaller => "NO_CALLER",
    NoMessage => "NO_MESSAGE",
    NoRoute => "NO_ROUTE",
    NoRouters => "NO_ROUTERS",
    NoSourceCell => "NO_SOURCE_CELL",
    NoUsers => "NO_USERS",
    OperationNotFound => "OPERATION_NOT_FOUND",
    OwnerLeaseExpired => "OWNER_LEASE_EXPIRED",
    OwnerUnreachable => "OWNER_UNREACHABLE",
    PipelineBusy => "PIPELINE_BUSY",
    PipelineUnavailable => "PIPELINE_UNAVAILABLE",
    PlacementFailed => "PLACEMENT_FAILED",
    PreviousOwnerLease => "PREVIOUS_OWNER_LEASE",
    PtsAhead => "PTS_AHEAD",
    RaftFatal => "RAFT_FATAL",
    RaftUnavailable => "RAFT_UNAVAILABLE",
    RecipientNotAMember => "RECIPIENT_NOT_A_MEMBER",
    // A tenant bound to regions: a placement, move or failover of one of
    // its routes to a cell outside them.
    ResidencyViolation => "RESIDENCY_VIOLATION",
    RetryLater => "RETRY_LATER",
    RoleNotAllowed => "ROLE_NOT_ALLOWED",
    RouteBehind => "ROUTE_BEHIND",
    RunsInCell => "RUNS_IN_CELL",
    SearchCursorInvalid => "SEARCH_CURSOR_INVALID",
    SearchDisabled => "SEARCH_DISABLED",
    SearchQueryInvalid => "SEARCH_QUERY_INVALID",
    SearchUnavailable => "SEARCH_UNAVAILABLE",
    SegmentCorrupt => "SEGMENT_CORRUPT",
    SegmentMissing => "SEGMENT_MISSING",
    ScanPending => "SCAN_PENDING",
    SeqOutOfRange => "SEQ_OUT_OF_RANGE",
    ShuttingDown => "SHUTTING_DOWN",
    SignatureExpired => "SIGNATURE_EXPIRED",
    SourceUnreachable => "SOURCE_UNREACHABLE",
    StaleEpoch => "STALE_EPOCH",
    StandbyLacksMeta => "STANDBY_LACKS_META",
    StandbyUnreachable => "STANDBY_UNREACHABLE",
    Stopping => "STOPPING",
    StorageError => "STORAGE_ERROR",
    StorageFailed => "STORAGE_FAILED",
    StreamSuperseded => "STREAM_SUPERSEDED",
    TitleTooLong => "TITLE_TOO_LONG",
    TokenAlgorithmRefused => "TOKEN_ALGORITHM_REFUSED",
    TokenExpired => "TOKEN_EXPIRED",
    TokenLifetimeTooLong => "TOKEN_LIFETIME_TOO_LONG",
    TokenRevoked => "TOKEN_REVOKED",
    TokenUnknownKey => "TOKEN_UNKNOWN_KEY",
    TokenWrongAudience => "TOKEN_WRONG_AUDIENCE",
    TokenWrongIssuer => "TOKEN_WRONG_ISSUER",
    TooManyAttachments => "TOO_MANY_ATTACHMENTS",
    TooManyMembers => "TOO_MANY_MEMBERS",
    TooManyMembersInRequest => "TOO_MANY_MEMBERS_IN_REQUEST",
    TooManyRecipients => "TOO_MANY_RECIPIENTS",
    TooManyStreams => "TOO_MANY_STREAMS",
    TooManyUsers => "TOO_MANY_USERS",
    UnknownCell => "UNKNOWN_CELL",
    UnknownConversationKind => "UNKNOWN_CONVERSATION_KIND",
    UnknownDirection => "UNKNOWN_DIRECTION",
    UnknownMessageType => "UNKNOWN_MESSAGE_TYPE",
    UnknownUser => "UNKNOWN_USER",
    UploadExpired => "UPLOAD_EXPIRED",
    UploadIncomplete => "UPLOAD_INCOMPLETE",
    UploadRateLimited => "UPLOAD_RATE_LIMITED",
    UserRateLimited => "USER_RATE_LIMITED",
    // A process older than the cluster version, or a finalize while some
    // process runs an older release than the version asked for.
    VersionBehind => "VERSION_BEHIND",
    WrongTenant => "WRONG_TENANT",
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A wire reason (an `ErrorInfo`'s `reason`) compared with one of ours.
impl PartialEq<Reason> for String {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Reason> for &str {
    fn eq(&self, other: &Reason) -> bool {
        *self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn every_reason_round_trips_and_is_screaming_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for &reason in Reason::ALL {
            let wire = reason.as_str();
            assert!(seen.insert(wire), "{wire} twice");
            assert!(
                wire.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{wire}"
            );
            assert_eq!(Reason::parse(wire), Some(reason));
        }
        assert_eq!(Reason::parse("GRPC_UNAVAILABLE"), None);
    }
}
