output "client_endpoint" {
  value = "${module.global_dns.fqdn}:7200"
}

output "cells" {
  value = flatten([for r in local.names : local.outputs[r].cell_ids])
}

output "router_members" {
  value = local.router_members
}

output "dns_records" {
  value = module.global_dns.record_count
}

output "peerings" {
  description = "Region pairs peered (every pair of deployed regions)."
  value = length(flatten([
    module.peering_eu_west_1_eu_central_1,
    module.peering_eu_west_1_us_east_1,
    module.peering_eu_west_1_us_west_2,
    module.peering_eu_west_1_ap_southeast_1,
    module.peering_eu_west_1_ap_northeast_1,
    module.peering_eu_central_1_us_east_1,
    module.peering_eu_central_1_us_west_2,
    module.peering_eu_central_1_ap_southeast_1,
    module.peering_eu_central_1_ap_northeast_1,
    module.peering_us_east_1_us_west_2,
    module.peering_us_east_1_ap_southeast_1,
    module.peering_us_east_1_ap_northeast_1,
    module.peering_us_west_2_ap_southeast_1,
    module.peering_us_west_2_ap_northeast_1,
    module.peering_ap_southeast_1_ap_northeast_1
  ]))
}

output "tls_identities" {
  description = "The certificate (file stem in tls_dir) each node's secret holds."
  value       = local.tls_stems
  precondition {
    condition     = length(local.tls_missing) == 0
    error_message = "tls_dir lacks the certificates of ${join(", ", local.tls_missing)}: run `cellmesh pki issue-all --dir ${var.tls_dir} --tfvars terraform.tfvars.json` with these variables."
  }
}
