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

use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use flight_serve_client::plugin::serve_plugin_until;
use flight_serve_client::Error;

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
    let result = serve_plugin_until(
        &server,
        &name,
        schema("v"),
        out.clone(),
        8,
        |batch| double(batch, &out),
        |instance| println!("attached {instance}"),
        stop,
    )
    .await;
    match result {
        Ok(stats) => println!("answered {} batches", stats.batches),
        Err(e) => {
            eprintln!("double_plugin: {e}");
            std::process::exit(1);
        }
    }
}
