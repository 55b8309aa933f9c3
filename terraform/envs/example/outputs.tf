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
