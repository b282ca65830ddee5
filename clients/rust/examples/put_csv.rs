//! Stream a CSV file into a flight-serve stream with `arrow-csv`, batch by batch.
//!
//!     flight-serve data nycflights13 --out flights.csv       # the 336,776 nycflights13 flights
//!     cargo run --example put_csv -- grpc://127.0.0.1:8815 flights.csv flights
//!
//! The schema is inferred from the first 1000 lines; the file is read in batches of 65,536
//! rows while the DoPut runs (the whole file is never in memory). Prints the rows and the last
//! durable offset.

use std::fs::File;
use std::io::Seek;
use std::sync::Arc;

use arrow_csv::reader::Format;
use arrow_csv::ReaderBuilder;
use flight_serve_client::Client;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [server, path, stream] = args.as_slice() else {
        eprintln!("usage: put_csv SERVER CSV_FILE STREAM");
        std::process::exit(2);
    };
    let mut file = File::open(path)?;
    let (schema, _) = Format::default()
        .with_header(true)
        .infer_schema(&mut file, Some(1000))?;
    file.rewind()?;
    let schema = Arc::new(schema);
    let reader = ReaderBuilder::new(schema.clone())
        .with_header(true)
        .with_batch_size(65_536)
        .build(file)?;
    let mut client = Client::connect(server).await?;
    let acks = client
        .put(stream, None, schema, futures::stream::iter(reader), false)
        .await?;
    let rows: u64 = acks.iter().map(|a| a.rows).sum();
    let last = acks.last().map(|a| a.offset as i64).unwrap_or(-1);
    println!(
        "{rows} rows in {} batches, last durable offset {last}",
        acks.len()
    );
    Ok(())
}
