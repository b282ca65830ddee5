//! [`Client`]: DoPut, queries, Flight SQL, tails and DoExchange against one flight-serve server.

use std::io::Cursor;

use arrow_array::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::utils::batches_to_flight_data;
use arrow_flight::{
    Action, FlightClient, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, Ticket,
};
use arrow_schema::{ArrowError, SchemaRef};
use base64::Engine;
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use serde_json::{Map, Value};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::proto;
use crate::{json_object, Error, Result};

/// The first four bytes of an Arrow IPC stream message (a DoExchange late-rows message).
const IPC_CONTINUATION: [u8; 4] = [0xff, 0xff, 0xff, 0xff];

/// Largest FlightData a DoPut sends by default (bytes of the IPC body; bigger batches are sent
/// as consecutive slices, each acknowledged with its own offset): below gRPC's common 4 MiB
/// receive limit.
pub const DEFAULT_PUT_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// One PutResult of a DoPut: the entry is durable on the server's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutAck {
    /// The entry's offset in the stream (sequence number of batches and markers, from 0).
    pub offset: u64,
    /// Rows of the batch (0 for a marker).
    pub rows: u64,
    /// For a watermark marker: its watermark, ns since the Unix epoch.
    pub watermark_ns: Option<i64>,
    /// For an end-of-input marker: `true`.
    pub end_of_input: bool,
}

impl PutAck {
    /// Decode a PutResult's app_metadata (`{"offset", "rows"}`, with `watermark_ns` or
    /// `end_of_input` for a marker).
    ///
    /// # Errors
    /// [`Error::Protocol`]: not such an object, or the server's `{"error": …}`.
    pub fn decode(metadata: &[u8]) -> Result<PutAck> {
        let message = json_object(metadata, "PutResult")?;
        if let Some(error) = message.get("error") {
            return Err(Error::Protocol(format!(
                "DoPut failed: {}",
                error.as_str().unwrap_or("?")
            )));
        }
        let int = |key: &str| {
            message.get(key).and_then(Value::as_u64).ok_or_else(|| {
                Error::Protocol(format!("PutResult: expected an integer {key:?} in {message:?}"))
            })
        };
        Ok(PutAck {
            offset: int("offset")?,
            rows: int("rows")?,
            watermark_ns: message.get("watermark_ns").and_then(Value::as_i64),
            end_of_input: message.get("end_of_input") == Some(&Value::Bool(true)),
        })
    }
}

/// A query's whole result.
#[derive(Clone, Debug)]
pub struct QueryResult {
    /// The result schema (from GetFlightInfo).
    pub schema: SchemaRef,
    /// The batches, endpoint after endpoint.
    pub batches: Vec<RecordBatch>,
}

impl QueryResult {
    /// Rows over all batches.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A stream's GetFlightInfo (`path = [stream]`).
#[derive(Clone, Debug)]
pub struct StreamInfo {
    /// The stream's schema.
    pub schema: SchemaRef,
    /// Rows stored.
    pub total_records: i64,
    /// First offset still stored.
    pub first_offset: u64,
    /// The offset the next entry gets.
    pub next_offset: u64,
    /// The stream's incarnation UUID.
    pub incarnation: String,
    /// The whole app_metadata object (with `writers`).
    pub metadata: Map<String, Value>,
}

/// One entry read by [`Client::tail`].
#[derive(Clone, Debug)]
pub struct TailEntry {
    /// The entry's offset.
    pub offset: u64,
    /// The DoPut writer that wrote it (`""` for the unnamed writer).
    pub writer: String,
    /// The rows (or the next piece of a batch the server split above its message size);
    /// `None` for a marker.
    pub batch: Option<RecordBatch>,
    /// A watermark marker's watermark, ns since the Unix epoch.
    pub watermark_ns: Option<i64>,
    /// An end-of-input marker.
    pub end_of_input: bool,
}

/// Everything a DoExchange windowed query sent back.
#[derive(Clone, Debug, Default)]
pub struct ExchangeOutput {
    /// The result schema (group keys, `window_start`, `window_end`, aggregates).
    pub schema: Option<SchemaRef>,
    /// Window results in the order received, with the input batch that closed them (`None`:
    /// closed by the flush after the input ended).
    pub results: Vec<(Option<usize>, RecordBatch)>,
    /// Late rows (input columns plus `_late_reason`, `_window_start`, `_window_end`), with the
    /// input batch that sent them.
    pub late: Vec<(Option<usize>, RecordBatch)>,
    /// Each input batch's acknowledgement `{"ack", "watermark_ns", "late_rows"}`.
    pub acks: Vec<Map<String, Value>>,
    /// The final `{"done": true, …}`.
    pub done: Map<String, Value>,
}

/// How [`Client::connect_with`] connects: TLS and credentials, as the Python client's
/// `FlightServeClient(location, token=…, username=…, password=…, tls_ca=…, tls_cert=…,
/// tls_key=…, override_hostname=…)`.
///
/// The TLS options need a `grpc+tls://` location; a `grpc+tls://` location without
/// [`tls_ca_pem`](ConnectOptions::tls_ca_pem) trusts the system's root certificates.
///
/// ```no_run
/// # async fn run() -> Result<(), flight_serve_client::Error> {
/// use flight_serve_client::{Client, ConnectOptions};
/// let options = ConnectOptions::new()
///     .tls_ca_pem(std::fs::read("ca.pem").unwrap())
///     .token("tok-ingest");
/// let mut client = Client::connect_with("grpc+tls://127.0.0.1:8815", options).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct ConnectOptions {
    tls_ca: Option<Vec<u8>>,
    tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    override_hostname: Option<String>,
    token: Option<String>,
    basic: Option<(String, String)>,
}

impl ConnectOptions {
    /// No TLS files, no credentials: [`Client::connect`]'s.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Trust the CA certificate(s) in `pem` (PEM bytes) for the server's certificate, instead
    /// of the system's roots (the server's `--tls-cert` was signed by this CA).
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> ConnectOptions {
        self.tls_ca = Some(pem.into());
        self
    }

    /// Present this client certificate and its private key (PEM bytes): mutual TLS, for a
    /// server started with `--tls-client-ca`.
    pub fn tls_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> ConnectOptions {
        self.tls_identity = Some((cert.into(), key.into()));
        self
    }

    /// Check the server's certificate against `name` instead of the location's host.
    pub fn override_hostname(mut self, name: impl Into<String>) -> ConnectOptions {
        self.override_hostname = Some(name.into());
        self
    }

    /// Send `authorization: Bearer <token>` on every call (a server with `--tokens-file`; the
    /// token's roles decide what it may do).
    pub fn token(mut self, token: impl Into<String>) -> ConnectOptions {
        self.token = Some(token.into());
        self
    }

    /// Run Flight's Basic handshake once when connecting (`authorization: Basic
    /// base64(user:password)`, a server with `--users-file`) and send the bearer token it
    /// returns on every call, as the Flight SQL drivers do.
    pub fn basic_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> ConnectOptions {
        self.basic = Some((user.into(), password.into()));
        self
    }
}

impl std::fmt::Debug for ConnectOptions {
    /// Which options are set, never the key, token or password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("tls_ca", &self.tls_ca.is_some())
            .field("tls_identity", &self.tls_identity.is_some())
            .field("override_hostname", &self.override_hostname)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("basic_auth_user", &self.basic.as_ref().map(|(user, _)| user))
            .finish()
    }
}

/// A connection to one flight-serve server.
///
/// Calls take `&mut self`; clone the client for concurrent calls (clones share the channel and
/// the credentials).
pub struct Client {
    channel: Channel,
    flight: FlightClient,
    authorization: Option<AsciiMetadataValue>,
    put_message_bytes: usize,
}

impl std::fmt::Debug for Client {
    /// The channel and whether calls carry credentials (never the header's value).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("channel", &self.channel)
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .field("put_message_bytes", &self.put_message_bytes)
            .finish()
    }
}

impl Clone for Client {
    fn clone(&self) -> Client {
        Client::from_channel(
            self.channel.clone(),
            self.authorization.clone(),
            self.put_message_bytes,
        )
    }
}

/// `grpc://` / `grpc+tcp://` as tonic's `http://`, `grpc+tls://` as `https://`.
pub(crate) fn endpoint_uri(location: &str) -> String {
    for (prefix, scheme) in [
        ("grpc+tcp://", "http"),
        ("grpc://", "http"),
        ("grpc+tls://", "https"),
    ] {
        if let Some(rest) = location.strip_prefix(prefix) {
            return format!("{scheme}://{rest}");
        }
    }
    if location.contains("://") {
        location.to_owned()
    } else {
        format!("http://{location}")
    }
}

/// A channel to `location` with the TLS files of `options`.
///
/// # Errors
/// [`Error::Options`]: TLS options for a location that is not `grpc+tls://`;
/// [`Error::Transport`]: the server cannot be reached, or the TLS handshake failed.
pub(crate) async fn connect_channel(location: &str, options: &ConnectOptions) -> Result<Channel> {
    let tls = location.starts_with("grpc+tls://");
    let given = [
        ("tls_ca_pem", options.tls_ca.is_some()),
        ("tls_identity_pem", options.tls_identity.is_some()),
        ("override_hostname", options.override_hostname.is_some()),
    ];
    if let (false, Some((name, _))) = (tls, given.iter().find(|(_, set)| *set)) {
        return Err(Error::Options(format!(
            "{name} is for a TLS server, but {location:?} is not grpc+tls://"
        )));
    }
    let mut endpoint = Endpoint::from_shared(endpoint_uri(location))
        .map_err(|e| Error::Options(format!("bad location {location:?}: {e}")))?;
    if tls {
        let mut config = match &options.tls_ca {
            Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        if let Some((cert, key)) = &options.tls_identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &options.override_hostname {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(config)?;
    }
    Ok(endpoint.connect().await?)
}

/// The `authorization` value every call of a client made with `options` sends (a Basic
/// handshake on `channel` when they hold a user and password).
///
/// # Errors
/// [`Error::Status`] `Unauthenticated`: the handshake refused the user or password;
/// [`Error::Protocol`]: the handshake answered without a bearer token.
pub(crate) async fn authorization(
    channel: &Channel,
    options: &ConnectOptions,
) -> Result<Option<AsciiMetadataValue>> {
    match (&options.token, &options.basic) {
        (Some(token), _) => Ok(Some(header_value(&format!("Bearer {token}"), "the token")?)),
        (None, Some((user, password))) => basic_handshake(channel.clone(), user, password).await.map(Some),
        (None, None) => Ok(None),
    }
}

/// Refuse options that contradict each other or cannot be sent, before connecting.
pub(crate) fn check_options(options: &ConnectOptions) -> Result<()> {
    if options.token.is_some() && options.basic.is_some() {
        return Err(Error::Options(
            "give either a token or a user and password (basic_auth), not both".into(),
        ));
    }
    if let Some(token) = &options.token {
        header_value(&format!("Bearer {token}"), "the token")?;
    }
    if let Some((user, _)) = &options.basic {
        if user.contains(':') {
            return Err(Error::Options(format!(
                "the user {user:?} contains ':' (Basic credentials are user:password)"
            )));
        }
    }
    Ok(())
}

fn header_value(value: &str, what: &str) -> Result<AsciiMetadataValue> {
    AsciiMetadataValue::try_from(value)
        .map_err(|_| Error::Options(format!("{what} is not a valid header value (visible ASCII only)")))
}

/// Flight's Basic handshake: Handshake with `authorization: Basic base64(user:password)`; the
/// server answers with the header `authorization: Bearer <token>`.
async fn basic_handshake(channel: Channel, user: &str, password: &str) -> Result<AsciiMetadataValue> {
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut request = tonic::Request::new(futures::stream::iter([HandshakeRequest::default()]));
    request.metadata_mut().insert(
        "authorization",
        header_value(&format!("Basic {credentials}"), "the user and password")?,
    );
    let response = FlightServiceClient::new(channel).handshake(request).await?;
    let mut value = response.metadata().get("authorization").cloned();
    let mut payloads = response.into_inner();
    while payloads.message().await?.is_some() {}
    if value.is_none() {
        value = payloads
            .trailers()
            .await?
            .and_then(|t| t.get("authorization").cloned());
    }
    match value {
        Some(v)
            if v.to_str()
                .is_ok_and(|s| s.len() > 7 && s[..7].eq_ignore_ascii_case("bearer ")) =>
        {
            Ok(v)
        }
        _ => Err(Error::Protocol(
            "the Basic handshake answered without an `authorization: Bearer …` header".into(),
        )),
    }
}

fn metadata_only(app_metadata: impl Into<Bytes>) -> FlightData {
    FlightData {
        app_metadata: app_metadata.into(),
        ..Default::default()
    }
}

/// `batch` as the FlightData messages that follow its stream's schema message (dictionaries,
/// then the batch); `app_metadata` goes on the batch.
pub(crate) fn batch_messages(batch: &RecordBatch, app_metadata: Bytes) -> Result<Vec<FlightData>> {
    let mut messages = batches_to_flight_data(batch.schema().as_ref(), [batch])?;
    messages.remove(0); // the schema
    if let Some(last) = messages.last_mut() {
        last.app_metadata = app_metadata;
    }
    Ok(messages)
}

/// A schema's FlightData message, carrying `descriptor`.
pub(crate) fn schema_message(schema: &SchemaRef, descriptor: FlightDescriptor) -> Result<FlightData> {
    let mut messages = batches_to_flight_data(schema.as_ref(), [])?;
    let mut first = messages.remove(0);
    first.flight_descriptor = Some(descriptor);
    Ok(first)
}

impl Client {
    /// Connect to `location` (`grpc://host:port`, `grpc+tcp://…`, or `host:port`; a
    /// `grpc+tls://` server with the system's root certificates), without credentials.
    ///
    /// # Errors
    /// [`Error::Transport`]: the server cannot be reached.
    pub async fn connect(location: &str) -> Result<Client> {
        Client::connect_with(location, ConnectOptions::new()).await
    }

    /// Connect to `location` with TLS files and credentials ([`ConnectOptions`]); with
    /// [`ConnectOptions::basic_auth`] the Basic handshake runs here, once.
    ///
    /// # Errors
    /// [`Error::Options`]: both a token and a user, a token that is not visible ASCII, TLS
    /// options for a location that is not `grpc+tls://`; [`Error::Transport`]: the server
    /// cannot be reached or its certificate is not trusted; [`Error::Status`]
    /// `Unauthenticated`: the handshake refused the user or password.
    pub async fn connect_with(location: &str, options: ConnectOptions) -> Result<Client> {
        check_options(&options)?;
        let channel = connect_channel(location, &options).await?;
        let authorization = authorization(&channel, &options).await?;
        Ok(Client::from_channel(
            channel,
            authorization,
            DEFAULT_PUT_MESSAGE_BYTES,
        ))
    }

    fn from_channel(
        channel: Channel,
        authorization: Option<AsciiMetadataValue>,
        put_message_bytes: usize,
    ) -> Client {
        let mut flight = FlightClient::new(channel.clone());
        if let Some(value) = &authorization {
            flight.metadata_mut().insert("authorization", value.clone());
        }
        Client {
            channel,
            flight,
            authorization,
            put_message_bytes,
        }
    }

    /// A request carrying this client's `authorization` header, for calls made on the raw
    /// service client (DoExchange).
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert("authorization", value.clone());
        }
        request
    }

    /// Set the largest FlightData body a DoPut sends (bytes; bigger batches go as slices).
    pub fn with_put_message_bytes(mut self, bytes: usize) -> Client {
        self.put_message_bytes = bytes;
        self
    }

    /// The underlying arrow-flight client.
    pub fn flight(&mut self) -> &mut FlightClient {
        &mut self.flight
    }

    // --- DoPut ---------------------------------------------------------------------------

    /// Append `batches` (all of `schema`) to `stream` with DoPut and wait until every one is
    /// durable; return the PutResults in order.
    ///
    /// `writer` names the DoPut writer (the stream's watermark partition, `path = [stream,
    /// writer]`); `None` writes as the unnamed writer. With `end_input` an `{"end_of_input":
    /// true}` marker follows the batches (its ack is last, `rows = 0`). The stream is created
    /// with `schema` if it does not exist. A batch above the put message size (2 MiB by
    /// default) is sent as slices, one ack each.
    ///
    /// # Errors
    /// [`Error::Status`] `InvalidArgument`: the schema differs from the stream's (the message
    /// names the fields), a bad stream or writer name, a writer already being written;
    /// [`Error::Protocol`]: a PutResult that is not `{"offset", "rows"}` JSON.
    pub async fn put<S>(
        &mut self,
        stream: &str,
        writer: Option<&str>,
        schema: SchemaRef,
        batches: S,
        end_input: bool,
    ) -> Result<Vec<PutAck>>
    where
        S: Stream<Item = Result<RecordBatch, ArrowError>> + Send + 'static,
    {
        let mut path = vec![stream.to_owned()];
        path.extend(writer.map(str::to_owned));
        let encoded = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .with_max_flight_data_size(self.put_message_bytes)
            .with_flight_descriptor(Some(FlightDescriptor::new_path(path)))
            .build(batches.map_err(FlightError::Arrow));
        let marker = end_input.then(|| Ok(metadata_only(&b"{\"end_of_input\": true}"[..])));
        let request = encoded.chain(futures::stream::iter(marker));
        let mut results = self.flight.do_put(request).await?;
        let mut acks = Vec::new();
        while let Some(result) = results.next().await {
            let result = result?;
            match PutAck::decode(&result.app_metadata) {
                Ok(ack) => acks.push(ack),
                Err(Error::Protocol(message)) if message.starts_with("DoPut failed") => {
                    // the server's status follows: it says more (its code)
                    while let Some(next) = results.next().await {
                        next?;
                    }
                    return Err(Error::Protocol(message));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(acks)
    }

    // --- queries -------------------------------------------------------------------------

    async fn read_endpoints(&mut self, info: FlightInfo) -> Result<QueryResult> {
        let schema = SchemaRef::new(info.clone().try_decode_schema()?);
        let mut batches = Vec::new();
        for endpoint in info.endpoint {
            let ticket = endpoint
                .ticket
                .ok_or_else(|| Error::Protocol("an endpoint without a ticket".into()))?;
            let stream = self.flight.do_get(ticket).await?;
            batches.extend(stream.try_collect::<Vec<_>>().await?);
        }
        Ok(QueryResult { schema, batches })
    }

    /// Run `sql` (DataFusion dialect; each stream is a table named after it) as the Python
    /// client does: GetFlightInfo with the SQL as the command descriptor, then DoGet of every
    /// endpoint's ticket, in order.
    ///
    /// # Errors
    /// [`Error::Status`] `InvalidArgument`: the SQL does not parse or plan (the message is the
    /// parser's); `NotFound`: an unknown table.
    pub async fn query(&mut self, sql: &str) -> Result<QueryResult> {
        let info = self
            .flight
            .get_flight_info(FlightDescriptor::new_cmd(sql.to_owned()))
            .await?;
        self.read_endpoints(info).await
    }

    /// Run `sql` through Flight SQL (`CommandStatementQuery` with `FlightSqlServiceClient`),
    /// then DoGet every endpoint.
    ///
    /// # Errors
    /// [`Error::Arrow`]: the server's status, as arrow-flight's SQL client reports it (its
    /// text holds the code and message).
    pub async fn flight_sql_query(&mut self, sql: &str) -> Result<QueryResult> {
        let mut sql_client = FlightSqlServiceClient::new(self.channel.clone());
        if let Some(value) = self.authorization.as_ref().and_then(|v| v.to_str().ok()) {
            sql_client.set_header("authorization", value);
        }
        let info = sql_client.execute(sql.to_owned(), None).await?;
        let schema = SchemaRef::new(info.clone().try_decode_schema()?);
        let mut batches = Vec::new();
        for endpoint in info.endpoint {
            let ticket = endpoint
                .ticket
                .ok_or_else(|| Error::Protocol("an endpoint without a ticket".into()))?;
            let stream = sql_client.do_get(ticket).await?;
            batches.extend(stream.try_collect::<Vec<_>>().await?);
        }
        Ok(QueryResult { schema, batches })
    }

    // --- streams -------------------------------------------------------------------------

    /// GetFlightInfo of stream `name`: schema, row count, offsets and incarnation.
    ///
    /// # Errors
    /// [`Error::Status`] `NotFound`: no such stream.
    pub async fn stream_info(&mut self, name: &str) -> Result<StreamInfo> {
        let info = self
            .flight
            .get_flight_info(FlightDescriptor::new_path(vec![name.into()]))
            .await?;
        let metadata = json_object(&info.app_metadata, "stream info")?;
        let int = |key: &str| {
            metadata
                .get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::Protocol(format!("stream info: expected an integer {key:?}")))
        };
        Ok(StreamInfo {
            schema: SchemaRef::new(info.clone().try_decode_schema()?),
            total_records: info.total_records,
            first_offset: int("first_offset")?,
            next_offset: int("next_offset")?,
            incarnation: metadata
                .get("incarnation")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::Protocol("stream info: no incarnation".into()))?
                .to_owned(),
            metadata,
        })
    }

    /// Run action `action_type` with a JSON body; the results' bodies.
    ///
    /// # Errors
    /// [`Error::Status`]: the server's status for the action.
    pub async fn action(&mut self, action_type: &str, body: &Value) -> Result<Vec<Bytes>> {
        let action = Action::new(action_type, serde_json::to_vec(body).expect("JSON"));
        let results = self.flight.do_action(action).await?;
        Ok(results.try_collect().await?)
    }

    /// Read `stream` from `offset` up to the `next_offset` it has when the call begins: every
    /// batch and marker, with its writer (`tail` without `-f`).
    ///
    /// The DoGet ticket is a `flight_serve.v1.Ticket` holding a [`proto::TailTicket`] for the
    /// stream's current incarnation, built and encoded here with prost. A batch the server
    /// split into pieces comes as several entries with the same offset.
    ///
    /// # Errors
    /// [`Error::Status`] `NotFound`: no such stream; [`Error::Protocol`]: a message without a
    /// JSON `{"offset": int}`.
    pub async fn tail(&mut self, stream: &str, offset: u64) -> Result<Vec<TailEntry>> {
        let info = self.stream_info(stream).await?;
        let end = info.next_offset;
        let mut entries = Vec::new();
        if offset >= end {
            return Ok(entries);
        }
        let ticket = proto::Ticket::tail(stream, &info.incarnation, offset).encode_to_vec();
        let response = self.flight.do_get(Ticket::new(ticket)).await?;
        let mut decoder: FlightDataDecoder = response.into_inner();
        while let Some(message) = decoder.next().await {
            let message = message?;
            let DecodedPayload::RecordBatch(batch) = message.payload else {
                continue; // the schema
            };
            let meta = json_object(&message.inner.app_metadata, "tail message")?;
            let entry_offset = meta
                .get("offset")
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::Protocol(format!("tail message without an offset: {meta:?}")))?;
            if entry_offset >= end {
                break;
            }
            let watermark_ns = meta.get("watermark_ns").and_then(Value::as_i64);
            let end_of_input = meta.get("end_of_input") == Some(&Value::Bool(true));
            let marker = watermark_ns.is_some() || end_of_input;
            let last_piece = match (
                meta.get("piece").and_then(Value::as_u64),
                meta.get("pieces").and_then(Value::as_u64),
            ) {
                (Some(piece), Some(pieces)) => piece + 1 >= pieces,
                _ => true,
            };
            entries.push(TailEntry {
                offset: entry_offset,
                writer: meta
                    .get("writer")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                batch: (!marker).then_some(batch),
                watermark_ns,
                end_of_input,
            });
            if entry_offset + 1 >= end && (marker || last_piece) {
                break; // the last entry below the end is whole; dropping the call cancels it
            }
        }
        Ok(entries)
    }

    // --- DoExchange ----------------------------------------------------------------------

    /// Run windowed query `sql` over `batches` (all of `schema`) inline with DoExchange
    /// (`cmd = sql`), in lock step as schemas/README.md describes: write one batch, read its
    /// window results and late rows up to its acknowledgement `{"ack": i}`; after the last,
    /// finish writing and read the flush up to `{"done": true}`.
    ///
    /// # Errors
    /// [`Error::Status`] `InvalidArgument`: not a windowed query flight-serve can run, or the
    /// event-time column is missing; [`Error::Protocol`]: the stream ended before an ack or
    /// `done`, or acknowledged another batch.
    pub async fn exchange(
        &mut self,
        sql: &str,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<ExchangeOutput> {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<FlightData>();
        let send = |message: FlightData| {
            sender
                .unbounded_send(message)
                .map_err(|_| Error::Protocol("DoExchange: the call ended early".into()))
        };
        send(schema_message(
            &schema,
            FlightDescriptor::new_cmd(sql.to_owned()),
        )?)?;
        let mut remaining = batches.into_iter().enumerate().peekable();
        if let Some((_, first)) = remaining.peek() {
            for message in batch_messages(first, Bytes::new())? {
                send(message)?;
            }
        }
        let request = self.request(receiver);
        let response = self.flight.inner_mut().do_exchange(request).await?;
        let mut frames = Frames::new(response.into_inner());
        let mut output = ExchangeOutput::default();
        let mut first = true;
        while let Some((index, batch)) = remaining.next() {
            if !first {
                for message in batch_messages(&batch, Bytes::new())? {
                    send(message)?;
                }
            }
            first = false;
            read_exchange(&mut frames, &mut output, Some(index)).await?;
        }
        sender.close_channel();
        read_exchange(&mut frames, &mut output, None).await?;
        Ok(output)
    }
}

/// Read exchange messages up to the ack of input batch `index` (or `done` when `None`).
async fn read_exchange(frames: &mut Frames, output: &mut ExchangeOutput, index: Option<usize>) -> Result<()> {
    let awaited = match index {
        Some(i) => format!("the ack of input batch {i}"),
        None => "done".to_owned(),
    };
    loop {
        let Some(frame) = frames.next().await else {
            return Err(Error::Protocol(format!(
                "DoExchange: the server ended the stream before {awaited}"
            )));
        };
        match frame? {
            Frame::Schema => output.schema = frames.schema.clone(),
            Frame::Batch(batch, _) => output.results.push((index, batch)),
            Frame::Metadata(raw) if raw.starts_with(&IPC_CONTINUATION) => {
                let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(raw.to_vec()), None)?;
                for batch in reader {
                    output.late.push((index, batch?));
                }
            }
            Frame::Metadata(raw) => {
                let meta = json_object(&raw, "exchange metadata")?;
                match (index, meta.get("ack").and_then(Value::as_u64), meta.get("done")) {
                    (Some(i), Some(ack), _) if ack as usize == i => {
                        output.acks.push(meta);
                        return Ok(());
                    }
                    (None, _, Some(Value::Bool(true))) => {
                        output.done = meta;
                        return Ok(());
                    }
                    _ => {
                        return Err(Error::Protocol(format!(
                            "DoExchange: expected {awaited}, got {meta:?}"
                        )))
                    }
                }
            }
        }
    }
}

/// One decoded message of a raw FlightData stream.
#[derive(Debug)]
pub(crate) enum Frame {
    /// The stream's schema.
    Schema,
    /// A record batch and its app_metadata.
    Batch(RecordBatch, Bytes),
    /// A metadata-only message (no IPC header).
    Metadata(Bytes),
}

/// Decodes FlightData as they come, metadata-only messages included: arrow-flight's
/// `FlightDataDecoder` refuses a message with an empty `data_header`, which Flight allows and
/// flight-serve sends (acks, late rows, the plugin protocol's control messages).
pub(crate) struct Frames {
    inner: tonic::Streaming<FlightData>,
    pub(crate) schema: Option<SchemaRef>,
}

impl Frames {
    pub(crate) fn new(inner: tonic::Streaming<FlightData>) -> Frames {
        Frames { inner, schema: None }
    }

    /// The next message; `None` once the server ended the call cleanly.
    pub(crate) async fn next(&mut self) -> Option<Result<Frame>> {
        match self.inner.message().await {
            Ok(Some(data)) => Some(self.decode(data)),
            Ok(None) => None,
            Err(status) => Some(Err(status.into())),
        }
    }

    fn decode(&mut self, data: FlightData) -> Result<Frame> {
        use arrow_ipc::MessageHeader;
        if data.data_header.is_empty() {
            return Ok(Frame::Metadata(data.app_metadata));
        }
        let message = arrow_ipc::root_as_message(&data.data_header)
            .map_err(|e| Error::Protocol(format!("not an Arrow IPC message header: {e}")))?;
        match message.header_type() {
            MessageHeader::NONE => Ok(Frame::Metadata(data.app_metadata)),
            MessageHeader::Schema => {
                self.schema = Some(SchemaRef::new(arrow_schema::Schema::try_from(&data)?));
                Ok(Frame::Schema)
            }
            MessageHeader::RecordBatch => {
                let schema = self
                    .schema
                    .clone()
                    .ok_or_else(|| Error::Protocol("a record batch before the schema".into()))?;
                let batch = arrow_flight::utils::flight_data_to_arrow_batch(
                    &data,
                    schema,
                    &std::collections::HashMap::new(),
                )?;
                Ok(Frame::Batch(batch, data.app_metadata))
            }
            other => Err(Error::Protocol(format!(
                "an IPC message this client does not read: {other:?}"
            ))),
        }
    }
}

/// A low-level client with a custom decoding limit, for callers that want one.
pub fn service_client(channel: Channel, max_decoding_message_size: usize) -> FlightServiceClient<Channel> {
    FlightServiceClient::new(channel).max_decoding_message_size(max_decoding_message_size)
}
