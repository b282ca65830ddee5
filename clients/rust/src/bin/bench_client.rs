//! The Rust side of benchmarks/clients.py (build with `cargo build --release --bin
//! bench_client`); prints one JSON line `{"seconds": s, "rows": n}`, timing only the call.
//!
//!     bench_client doget SERVER STREAM          # GetFlightInfo(path = [STREAM]) + DoGet
//!     bench_client doput SERVER STREAM ROWS     # DoPut ROWS rows (x int64 = i, y double = i / 2)
//!                                               # in 65,536-row batches, made before the clock

use std::sync::Arc;
use std::time::Instant;

use arrow_array::{Float64Array, Int64Array, RecordBatch};
use arrow_flight::FlightDescriptor;
use arrow_schema::{DataType, Field, Schema};
use flight_serve_client::Client;
use futures::TryStreamExt;

#[tokio::main]
async fn main() -> Result<(), flight_serve_client::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut client = Client::connect(&args[1]).await?;
    let start;
    let rows: u64;
    match args[0].as_str() {
        "doget" => {
            start = Instant::now();
            let info = client
                .flight()
                .get_flight_info(FlightDescriptor::new_path(vec![args[2].clone()]))
                .await?;
            let mut n = 0u64;
            for endpoint in info.endpoint {
                let mut stream = client.flight().do_get(endpoint.ticket.unwrap()).await?;
                while let Some(batch) = stream.try_next().await? {
                    n += batch.num_rows() as u64;
                }
            }
            rows = n;
        }
        "doput" => {
            let total: i64 = args[3].parse().unwrap();
            let schema = Arc::new(Schema::new(vec![
                Field::new("x", DataType::Int64, false),
                Field::new("y", DataType::Float64, false),
            ]));
            let batches: Vec<RecordBatch> = (0..total)
                .step_by(65_536)
                .map(|lo| {
                    let hi = (lo + 65_536).min(total);
                    RecordBatch::try_new(
                        schema.clone(),
                        vec![
                            Arc::new(Int64Array::from_iter_values(lo..hi)),
                            Arc::new(Float64Array::from_iter_values((lo..hi).map(|i| i as f64 / 2.0))),
                        ],
                    )
                    .unwrap()
                })
                .collect();
            start = Instant::now();
            let acks = client
                .put(
                    &args[2],
                    None,
                    schema,
                    futures::stream::iter(batches.into_iter().map(Ok)),
                    false,
                )
                .await?;
            rows = acks.iter().map(|a| a.rows).sum();
        }
        other => panic!("unknown command {other}"),
    }
    println!(
        "{{\"seconds\": {}, \"rows\": {rows}}}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
