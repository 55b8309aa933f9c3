//! Arbitrary text as the TOML config of every role: parsing and validation
//! answer with an error naming what is wrong, never a panic (no overflow
//! when a value is scaled, no allocation sized by a value).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use cellmesh_proto::config::parse_toml;
    if let Ok(config) = parse_toml::<cellmesh_cell::CellConfig>(text) {
        let _ = config.validate();
    }
    if let Ok(config) = parse_toml::<cellmesh_edge::EdgeConfig>(text) {
        let _ = config.validate();
    }
    if let Ok(config) = parse_toml::<cellmesh_router::config::RouterConfig>(text) {
        let _ = config.validate();
    }
    if let Ok(config) = parse_toml::<cellmesh_control_plane::server::ControlPlaneConfig>(text) {
        let _ = config.validate();
    }
});
