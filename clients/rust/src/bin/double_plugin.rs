//! A flight-serve plugin in Rust: rows `(k utf8, t timestamp[s], v int64)` in, `(k, t, v2 =
//! 2 v)` out: the `double` plugin of tests/integration/plugin_proc.py.
//!
//!     double_plugin grpc://127.0.0.1:8815 [NAME]
//!
//! Use it from a pipeline with
//! `CREATE FUNCTION double() RETURNS TABLE (k VARCHAR, t TIMESTAMP(0), v2 BIGINT)
//! WITH (connector = 'plugin');`. Prints `attached <instance>` once the server accepted it and
//! `answered <n> batches` when the call ends. SIGTERM or Ctrl-C leaves cleanly (the server gives
//! the batches not yet answered to another instance).
//!
//! A server with TLS or tokens: `FLIGHT_SERVE_TOKEN` (a bearer token with the `write` role, as the
//! `flight-serve` command line reads it), `FLIGHT_SERVE_TLS_CA` (the CA's PEM file) and, for
//! mutual TLS, `FLIGHT_SERVE_TLS_CERT` and `FLIGHT_SERVE_TLS_KEY` (the client's PEM files), with
//! a `grpc+tls://` location.

use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use flight_serve_client::plugin::serve_plugin_on;
use flight_serve_client::{Client, ConnectOptions, Error};

fn schema(value: &str) -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("t", DataType::Timestamp(TimeUnit::Second, None), true),
        Field::new(value, DataType::Int64, true),
    ]))
}

fn double(batch: &RecordBatch, out: &Arc<Schema>) -> Result<RecordBatch, Error> {
    let v = batch
        .column(2)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| Error::Protocol("column v is not int64".into()))?;
    let v2: Int64Array = v.iter().map(|x| x.map(|x| x.wrapping_mul(2))).collect();
    let v2: Arc<dyn Array> = Arc::new(v2);
    Ok(RecordBatch::try_new(
        out.clone(),
        vec![batch.column(0).clone(), batch.column(1).clone(), v2],
    )?)
}

/// The client for `server` with the TLS files and token the environment names.
async fn connect(server: &str) -> Result<Client, Error> {
    let pem = |variable: &str| -> Result<Option<Vec<u8>>, Error> {
        match std::env::var_os(variable) {
            None => Ok(None),
            Some(path) => std::fs::read(&path)
                .map(Some)
                .map_err(|e| Error::Options(format!("{variable}: cannot read {path:?}: {e}"))),
        }
    };
    let mut options = ConnectOptions::new();
    if let Some(token) = std::env::var_os("FLIGHT_SERVE_TOKEN") {
        options = options.token(token.to_string_lossy());
    }
    if let Some(ca) = pem("FLIGHT_SERVE_TLS_CA")? {
        options = options.tls_ca_pem(ca);
    }
    match (pem("FLIGHT_SERVE_TLS_CERT")?, pem("FLIGHT_SERVE_TLS_KEY")?) {
        (Some(cert), Some(key)) => options = options.tls_identity_pem(cert, key),
        (None, None) => {}
        _ => {
            return Err(Error::Options(
                "FLIGHT_SERVE_TLS_CERT and FLIGHT_SERVE_TLS_KEY go together".into(),
            ))
        }
    }
    Client::connect_with(server, options).await
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let server = args.next().unwrap_or_else(|| "grpc://127.0.0.1:8815".into());
    let name = args.next().unwrap_or_else(|| "double".into());
    let out = schema("v2");
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let result = match connect(&server).await {
        Ok(client) => {
            serve_plugin_on(
                client,
                &name,
                schema("v"),
                out.clone(),
                8,
                |batch| double(batch, &out),
                |instance| println!("attached {instance}"),
                stop,
            )
            .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(stats) => println!("answered {} batches", stats.batches),
        Err(e) => {
            eprintln!("double_plugin: {e}");
            std::process::exit(1);
        }
    }
}
