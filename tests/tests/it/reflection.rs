//! Server reflection for generic tools: every server answers both `v1` and
//! `v1alpha` (the only version some standard clients, such as Python's
//! grpcio-reflection, speak), listing the services it serves and no other.

use cellmesh_tests::TestCell;
use tonic_reflection::pb::{v1, v1alpha};

#[tokio::test]
async fn a_cell_lists_its_services_over_both_reflection_versions() {
    let cell = TestCell::start().await;
    let channel = tonic::transport::Channel::from_shared(cell.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for wanted in [
        "cellmesh.v1.Messaging",
        "cellmesh.v1.Sync",
        "cellmesh.v1.CellPeer",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(names.iter().any(|n| n == wanted), "{wanted} in {names:?}");
    }
    // Only what this server serves: not the route table's services.
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("cellmesh.v1.Routing") || n.contains("Raft")),
        "{names:?}"
    );

    let mut current = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = current
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    assert!(
        matches!(
            answer.message_response,
            Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(ref l))
                if l.service.iter().any(|s| s.name == "cellmesh.v1.Messaging")
        ),
        "{answer:?}"
    );
}
