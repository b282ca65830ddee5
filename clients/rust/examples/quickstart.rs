//! The README's Rust quick start: put three rows, query them, tail the stream.
//!
//!     cargo run --example quickstart -- grpc://127.0.0.1:8815

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use flight_serve_client::Client;

#[tokio::main]
async fn main() -> Result<(), flight_serve_client::Error> {
    let server = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "grpc://127.0.0.1:8815".into());
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("n", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["a", "b", "a"])),
            Arc::new(Int64Array::from(vec![1, 2, 3])),
        ],
    )?;
    let mut client = Client::connect(&server).await?;
    // DoPut: one PutAck per batch once it is durable (writer None: the unnamed writer)
    let acks = client
        .put("quick", None, schema, futures::stream::iter([Ok(batch)]), false)
        .await?;
    println!("durable at offset {}", acks.last().unwrap().offset);
    // GetFlightInfo(cmd = SQL) + DoGet, as the Python client does
    let result = client
        .query("SELECT key, sum(n) AS total FROM quick GROUP BY key ORDER BY key")
        .await?;
    println!("{}", arrow_cast::pretty::pretty_format_batches(&result.batches)?);
    // the same through Flight SQL
    let counted = client
        .flight_sql_query("SELECT count(*) AS rows FROM quick")
        .await?;
    println!("{}", arrow_cast::pretty::pretty_format_batches(&counted.batches)?);
    // the stream's entries from offset 0 (a prost TailTicket)
    for entry in client.tail("quick", 0).await? {
        println!(
            "offset {}: {} rows",
            entry.offset,
            entry.batch.map_or(0, |b| b.num_rows())
        );
    }
    Ok(())
}
