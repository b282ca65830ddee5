//! A transform plugin in Rust: [`serve_plugin`] attaches a function `RecordBatch ->
//! RecordBatch` to a flight-serve server over the plugin protocol (schemas/README.md, "Plugin
//! protocol"):
//!
//! 1. DoExchange whose first message carries only the descriptor `path = ["plugins", name]`;
//! 2. the hello, metadata-only: UTF-8 JSON `{"protocol": 1, "name", "input_schema",
//!    "output_schema", "max_in_flight"}`, each schema a base64 Arrow IPC schema message
//!    ([`hello_message`]); then the output stream's schema message;
//! 3. the server answers `{"accepted": true, "instance": id, …}`, then sends input batches
//!    tagged `{"seq": N}` (and `{"heartbeat": true}` when idle); each is answered with exactly
//!    one result batch tagged `{"seq": N}`, in the order they came;
//! 4. `{"closing": true}`: the server stops; the plugin finishes writing and the call ends.

use arrow_array::RecordBatch;
use arrow_flight::{FlightData, FlightDescriptor};
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_schema::{Schema, SchemaRef};
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::client::{batch_messages, Frame, Frames};
use crate::Client;
use crate::{json_object, Error, Result};

/// The plugin protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// What [`serve_plugin`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginStats {
    /// Input batches answered.
    pub batches: u64,
    /// Rows received.
    pub rows_in: u64,
    /// Rows sent back.
    pub rows_out: u64,
    /// The instance id from the server's accept message.
    pub instance: Option<i64>,
}

/// `schema` as an encapsulated Arrow IPC schema message (continuation marker, length,
/// flatbuffer, padding): what the hello carries, base64-encoded.
pub fn ipc_schema_bytes(schema: &Schema) -> Result<Vec<u8>> {
    let options = IpcWriteOptions::default();
    let mut tracker = DictionaryTracker::new(false);
    let encoded =
        IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(schema, &mut tracker, &options);
    let mut out = Vec::new();
    arrow_ipc::writer::write_message(&mut out, encoded, &options)?;
    Ok(out)
}

/// Decode a hello schema field: base64 of an IPC schema message.
///
/// # Errors
/// [`Error::Protocol`] naming `what`: not base64, or not an IPC schema message.
pub fn schema_from_b64(value: &str, what: &str) -> Result<Schema> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(value)
        .map_err(|e| Error::Protocol(format!("{what}: not base64: {e}")))?;
    arrow_ipc::convert::try_schema_from_ipc_buffer(&raw)
        .map_err(|e| Error::Protocol(format!("{what}: not an Arrow IPC schema message: {e}")))
}

/// The hello's bytes: compact UTF-8 JSON `{"protocol":1,"name":…,"input_schema":…,
/// "output_schema":…,"max_in_flight":n}` (keys in that order).
pub fn hello_message(
    name: &str,
    input_schema: &Schema,
    output_schema: &Schema,
    max_in_flight: u32,
) -> Result<Vec<u8>> {
    let b64 = |schema: &Schema| -> Result<String> {
        Ok(base64::engine::general_purpose::STANDARD.encode(ipc_schema_bytes(schema)?))
    };
    let mut hello = serde_json::Map::new();
    hello.insert("protocol".into(), json!(PROTOCOL_VERSION));
    hello.insert("name".into(), json!(name));
    hello.insert("input_schema".into(), json!(b64(input_schema)?));
    hello.insert("output_schema".into(), json!(b64(output_schema)?));
    hello.insert("max_in_flight".into(), json!(max_in_flight));
    Ok(serde_json::to_vec(&Value::Object(hello)).expect("JSON"))
}

/// The app_metadata of a result batch: compact `{"seq":N}`.
pub fn seq_metadata(seq: i64) -> Bytes {
    Bytes::from(format!("{{\"seq\":{seq}}}"))
}

/// Attach `transform` as plugin `name` to the server at `location` and answer every input
/// batch with `transform(batch)` until the server ends the call or says it is closing.
///
/// `on_attached` is called once with the instance id when the server accepts the hello. The
/// server selects and casts the input columns to `input_schema`; every result must have
/// `output_schema` (the pipeline's `RETURNS TABLE`). `max_in_flight` (1 … 1024) is how many
/// batches the server may send before one is answered.
///
/// # Errors
/// [`Error::Status`] `InvalidArgument`: the server refused the hello (the message names the
/// field) or detached the instance (a wrong result schema); an error of `transform`, after
/// which the plugin reports `{"error": …}` and leaves.
pub async fn serve_plugin<F, A>(
    location: &str,
    name: &str,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    max_in_flight: u32,
    transform: F,
    on_attached: A,
) -> Result<PluginStats>
where
    F: FnMut(&RecordBatch) -> Result<RecordBatch>,
    A: FnMut(i64),
{
    let never = futures::future::pending::<()>();
    serve_plugin_until(
        location,
        name,
        input_schema,
        output_schema,
        max_in_flight,
        transform,
        on_attached,
        never,
    )
    .await
}

/// [`serve_plugin`] that also leaves cleanly when `stop` completes (e.g. on SIGTERM): it
/// finishes writing, so the server ends the call without an error and gives the batches not yet
/// answered to another instance (or keeps them until one attaches).
///
/// # Errors
/// Those of [`serve_plugin`].
#[allow(clippy::too_many_arguments)]
pub async fn serve_plugin_until<F, A, S>(
    location: &str,
    name: &str,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    max_in_flight: u32,
    transform: F,
    on_attached: A,
    stop: S,
) -> Result<PluginStats>
where
    F: FnMut(&RecordBatch) -> Result<RecordBatch>,
    A: FnMut(i64),
    S: std::future::Future<Output = ()>,
{
    let client = Client::connect(location).await?;
    serve_plugin_on(
        client,
        name,
        input_schema,
        output_schema,
        max_in_flight,
        transform,
        on_attached,
        stop,
    )
    .await
}

/// [`serve_plugin_until`] on a connected [`Client`], whose TLS and credentials the plugin's
/// call uses ([`Client::connect_with`]; attaching needs the `write` role on a server with
/// `--tokens-file`).
///
/// # Errors
/// Those of [`serve_plugin`]; [`Error::Status`] `Unauthenticated`: the client has no or an
/// unknown token; `PermissionDenied`: its token lacks the `write` role.
#[allow(clippy::too_many_arguments)]
pub async fn serve_plugin_on<F, A, S>(
    mut client: Client,
    name: &str,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    max_in_flight: u32,
    mut transform: F,
    mut on_attached: A,
    stop: S,
) -> Result<PluginStats>
where
    F: FnMut(&RecordBatch) -> Result<RecordBatch>,
    A: FnMut(i64),
    S: std::future::Future<Output = ()>,
{
    let (sender, receiver) = futures::channel::mpsc::unbounded::<FlightData>();
    let send = |message: FlightData| {
        sender
            .unbounded_send(message)
            .map_err(|_| Error::Protocol("plugin exchange: the call ended".into()))
    };
    let descriptor = FlightDescriptor::new_path(vec!["plugins".into(), name.into()]);
    send(FlightData {
        flight_descriptor: Some(descriptor),
        ..Default::default()
    })?;
    send(FlightData {
        app_metadata: hello_message(name, &input_schema, &output_schema, max_in_flight)?.into(),
        ..Default::default()
    })?;
    let mut schema_message = arrow_flight::utils::batches_to_flight_data(&output_schema, [])?;
    send(schema_message.remove(0))?;

    let request = client.request(receiver);
    let response = client.flight().inner_mut().do_exchange(request).await?;
    let mut frames = Frames::new(response.into_inner());
    let mut stats = PluginStats::default();
    let mut failure: Option<Error> = None;
    let mut stop = std::pin::pin!(stop);
    loop {
        let frame = tokio::select! {
            biased;
            _ = &mut stop => break,
            frame = frames.next() => frame,
        };
        let Some(frame) = frame else { break };
        match frame? {
            Frame::Schema => {}
            Frame::Metadata(raw) => {
                let meta = json_object(&raw, "plugin exchange")?;
                if meta.get("accepted") == Some(&Value::Bool(true)) {
                    stats.instance = meta.get("instance").and_then(Value::as_i64);
                    on_attached(stats.instance.unwrap_or(-1));
                } else if meta.get("closing") == Some(&Value::Bool(true)) {
                    break; // the server stops: finish writing; it ends the call
                }
                // heartbeats (and the hello watchdog's {"error"}) need no answer
            }
            Frame::Batch(batch, raw) => {
                let meta = json_object(&raw, "plugin input")?;
                let seq = meta.get("seq").and_then(Value::as_i64).ok_or_else(|| {
                    Error::Protocol(format!("plugin input without an integer seq: {meta:?}"))
                })?;
                stats.rows_in += batch.num_rows() as u64;
                match transform(&batch) {
                    Ok(result) => {
                        stats.rows_out += result.num_rows() as u64;
                        for out in batch_messages(&result, seq_metadata(seq))? {
                            send(out)?;
                        }
                        stats.batches += 1;
                    }
                    Err(e) => {
                        let text = json!({ "error": e.to_string() }).to_string();
                        send(FlightData {
                            app_metadata: text.into(),
                            ..Default::default()
                        })?;
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
    }
    sender.close_channel();
    // read to the end so the server's status (if any) is seen; it ends the call soon after
    while let Some(frame) = frames.next().await {
        if let Err(e) = frame {
            if failure.is_none() && e.code() != Some(tonic::Code::Cancelled) {
                failure = Some(e);
            }
            break;
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(stats),
    }
}
