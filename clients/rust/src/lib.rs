//! A Rust client for flight-serve, on `arrow-flight` (tonic, prost).
//!
//! The wire contract is `schemas/README.md` in the flight-serve repository; the Python client
//! (`clients/python/flight_serve_client`) is the reference this crate follows.
//!
//! * [`Client::put`]: DoPut a stream of record batches, one [`PutAck`] (the durable offset) per
//!   PutResult;
//! * [`Client::connect_with`]: TLS (a CA, mutual TLS) and a bearer token or a user and
//!   password ([`ConnectOptions`]);
//! * [`Client::query`]: a SQL query as the Python client runs it (GetFlightInfo with the SQL as
//!   the command descriptor, then DoGet of every endpoint);
//! * [`Client::flight_sql_query`]: the same through Flight SQL (`FlightSqlServiceClient`);
//! * [`Client::tail`]: a stream's entries from an offset, with a [`proto::TailTicket`] built here;
//! * [`Client::exchange`]: a windowed query over inline batches (DoExchange);
//! * [`plugin::serve_plugin`]: a transform plugin attached over the plugin protocol.
//!
//! ```no_run
//! # async fn run() -> Result<(), flight_serve_client::Error> {
//! let mut client = flight_serve_client::Client::connect("grpc://127.0.0.1:8815").await?;
//! let result = client.query("SELECT count(*) AS n FROM flights").await?;
//! println!("{} rows", result.num_rows());
//! # Ok(()) }
//! ```

pub mod client;
pub mod plugin;
pub mod proto;

pub use client::{Client, ConnectOptions, ExchangeOutput, PutAck, QueryResult, StreamInfo, TailEntry};

use std::fmt;

/// What a call of this crate can fail with.
#[derive(Debug)]
pub enum Error {
    /// The server answered with a gRPC status (its code says what kind of error:
    /// `InvalidArgument` for bad SQL or a schema mismatch, `NotFound` for an unknown stream, …).
    Status(tonic::Status),
    /// The connection could not be made.
    Transport(tonic::transport::Error),
    /// Arrow could not encode or decode a batch.
    Arrow(arrow_schema::ArrowError),
    /// The server sent something the wire contract does not allow (or a DoPut ended with the
    /// server's `{"error": …}` PutResult).
    Protocol(String),
    /// Another arrow-flight error.
    Flight(arrow_flight::error::FlightError),
    /// [`ConnectOptions`] (or a location) that cannot be used; the message names the option.
    Options(String),
}

impl Error {
    /// The gRPC status code, when the server answered with a status.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status(status) => Some(status.code()),
            Error::Flight(arrow_flight::error::FlightError::Tonic(status)) => Some(status.code()),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            Error::Transport(e) => write!(f, "transport: {e}"),
            Error::Arrow(e) => write!(f, "arrow: {e}"),
            Error::Protocol(m) => write!(f, "protocol: {m}"),
            Error::Flight(e) => write!(f, "flight: {e}"),
            Error::Options(m) => write!(f, "options: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<arrow_flight::error::FlightError> for Error {
    fn from(e: arrow_flight::error::FlightError) -> Self {
        match e {
            arrow_flight::error::FlightError::Tonic(status) => Error::Status(*status),
            arrow_flight::error::FlightError::Arrow(e) => Error::Arrow(e),
            other => Error::Flight(other),
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        Error::Status(s)
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::Transport(e)
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::Arrow(e)
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Decode a JSON-object app_metadata; `what` names the message in the error.
pub(crate) fn json_object(metadata: &[u8], what: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_slice::<serde_json::Value>(metadata) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(Error::Protocol(format!(
            "{what}: app_metadata is not a JSON object: {:?}",
            String::from_utf8_lossy(&metadata[..metadata.len().min(80)])
        ))),
    }
}
