//! `flight_serve.v1` tickets (`schemas/flight_serve/v1/ticket.proto`) as prost messages.
//!
//! Written by hand in the shape `prost-build` generates (the build needs no `protoc`); the
//! shared vectors (`schemas/vectors/ticket_*.bin`, `tests/vectors.rs`) check that these
//! structs encode byte for byte what the server writes. Keep the tags equal to the `.proto`.

/// Envelope of every ticket; `version` is 1.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Ticket {
    /// Codec version; this crate writes and reads version 1.
    #[prost(uint32, tag = "1")]
    pub version: u32,
    /// The ticket's kind.
    #[prost(oneof = "ticket::Kind", tags = "2, 3, 4")]
    pub kind: ::core::option::Option<ticket::Kind>,
}

/// The `kind` oneof of [`Ticket`].
pub mod ticket {
    /// A query, a stream range, or a tail.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Kind {
        /// A SQL query over pinned streams.
        #[prost(message, tag = "2")]
        Query(super::QueryTicket),
        /// The batches `[start_offset, stop_offset)` of one stream incarnation.
        #[prost(message, tag = "3")]
        StreamRange(super::StreamRangeTicket),
        /// Follow one stream incarnation live from `start_offset`.
        #[prost(message, tag = "4")]
        Tail(super::TailTicket),
    }
}

/// One stream as it was when a query was planned (batches `[0, stop_offset)`).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StreamPin {
    /// Stream name, `[A-Za-z0-9_.-]{1,200}`.
    #[prost(string, tag = "1")]
    pub stream: ::prost::alloc::string::String,
    /// The stream's incarnation UUID (canonical text form).
    #[prost(string, tag = "2")]
    pub incarnation: ::prost::alloc::string::String,
    /// Exclusive end offset pinned at planning time.
    #[prost(uint64, tag = "3")]
    pub stop_offset: u64,
}

/// A SQL query (DataFusion dialect) over the pinned streams.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct QueryTicket {
    /// The SQL text.
    #[prost(string, tag = "1")]
    pub sql: ::prost::alloc::string::String,
    /// Every stream the query reads.
    #[prost(message, repeated, tag = "2")]
    pub streams: ::prost::alloc::vec::Vec<StreamPin>,
}

/// The batches `[start_offset, stop_offset)` of one stream incarnation.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StreamRangeTicket {
    /// Stream name.
    #[prost(string, tag = "1")]
    pub stream: ::prost::alloc::string::String,
    /// Incarnation UUID.
    #[prost(string, tag = "2")]
    pub incarnation: ::prost::alloc::string::String,
    /// First offset read.
    #[prost(uint64, tag = "3")]
    pub start_offset: u64,
    /// Exclusive end offset.
    #[prost(uint64, tag = "4")]
    pub stop_offset: u64,
}

/// Follows one stream incarnation live, from `start_offset` on.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct TailTicket {
    /// Stream name.
    #[prost(string, tag = "1")]
    pub stream: ::prost::alloc::string::String,
    /// Incarnation UUID.
    #[prost(string, tag = "2")]
    pub incarnation: ::prost::alloc::string::String,
    /// First offset read.
    #[prost(uint64, tag = "3")]
    pub start_offset: u64,
}

/// The ticket codec version this crate writes.
pub const TICKET_VERSION: u32 = 1;

impl Ticket {
    /// A version-1 ticket of `kind`.
    pub fn new(kind: ticket::Kind) -> Self {
        Ticket {
            version: TICKET_VERSION,
            kind: Some(kind),
        }
    }

    /// A version-1 tail ticket: `stream`'s incarnation `incarnation` from `start_offset` on.
    pub fn tail(stream: &str, incarnation: &str, start_offset: u64) -> Self {
        Self::new(ticket::Kind::Tail(TailTicket {
            stream: stream.to_owned(),
            incarnation: incarnation.to_owned(),
            start_offset,
        }))
    }
}
