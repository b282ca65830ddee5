//! arrow-flight's own `FlightSqlServiceClient` against a real flight-serve: DDL and DML with
//! `execute_update`, a prepared statement with a bound parameter, and the metadata calls a SQL
//! tool makes first (catalogs, tables, SqlInfo).

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetTables, SqlInfo};
use arrow_flight::FlightInfo;
use arrow_schema::{DataType, Field, Schema};
use common::Server;
use futures::TryStreamExt;
use tonic::transport::Channel;

async fn sql_client(server: &Server) -> FlightSqlServiceClient<Channel> {
    let uri = server.location.replacen("grpc://", "http://", 1);
    FlightSqlServiceClient::new(Channel::from_shared(uri).unwrap().connect().await.unwrap())
}

async fn fetch(client: &mut FlightSqlServiceClient<Channel>, info: FlightInfo) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for endpoint in info.endpoint {
        let stream = client.do_get(endpoint.ticket.unwrap()).await.unwrap();
        out.extend(stream.try_collect::<Vec<_>>().await.unwrap());
    }
    out
}

fn strings(batches: &[RecordBatch], column: &str) -> Vec<Option<String>> {
    batches
        .iter()
        .flat_map(|b| {
            let c = arrow_cast::cast(b.column_by_name(column).unwrap(), &DataType::Utf8).unwrap();
            c.as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn ddl_dml_prepared_and_metadata() {
    let server = Server::start();
    let mut client = sql_client(&server).await;
    assert_eq!(
        client
            .execute_update("CREATE TABLE t (a BIGINT, s VARCHAR)".into(), None)
            .await
            .unwrap(),
        0
    );
    let inserted = client
        .execute_update("INSERT INTO t VALUES (1, 'x'), (2, 'y'), (3, NULL)".into(), None)
        .await
        .unwrap();
    assert_eq!(inserted, 3);

    let mut prepared = client
        .prepare("SELECT a, s FROM t WHERE a > ? ORDER BY a".into(), None)
        .await
        .unwrap();
    let params = Arc::new(Schema::new(vec![Field::new("$1", DataType::Int64, true)]));
    prepared
        .set_parameters(RecordBatch::try_new(params, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap())
        .unwrap();
    let info = prepared.execute().await.unwrap();
    let rows = fetch(&mut client, info).await;
    let a: Vec<i64> = rows
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(a, vec![2, 3]);
    assert_eq!(strings(&rows, "s"), vec![Some("y".to_owned()), None]);
    prepared.close().await.unwrap();

    let catalogs = client.get_catalogs().await.unwrap();
    let catalogs = fetch(&mut client, catalogs).await;
    assert!(!strings(&catalogs, "catalog_name").is_empty(), "{catalogs:?}");

    let tables = client
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: None,
            table_name_filter_pattern: Some("t".into()),
            table_types: vec![],
            include_schema: false,
        })
        .await
        .unwrap();
    let tables = fetch(&mut client, tables).await;
    assert_eq!(strings(&tables, "table_name"), vec![Some("t".to_owned())]);

    let info = client
        .get_sql_info(vec![
            SqlInfo::FlightSqlServerName,
            SqlInfo::FlightSqlServerReadOnly,
        ])
        .await
        .unwrap();
    let info = fetch(&mut client, info).await;
    let names: Vec<u32> = info
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<arrow_array::types::UInt32Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(names.len(), 2, "{info:?}");

    let bad = client.execute("SELEC 1".into(), None).await.unwrap_err();
    assert!(
        bad.to_string().contains("InvalidArgument") || bad.to_string().contains("invalid"),
        "{bad}"
    );

    assert_eq!(
        client.execute_update("DROP TABLE t".into(), None).await.unwrap(),
        0
    );
}
