output "cell_ids" {
  value = module.cell[*].cell_id
}

output "router_node_ids" {
  value = module.routers.node_ids
}

output "edge" {
  value = { dns_name = module.edge.lb_dns_name, port = module.edge.port }
}

output "zone_id" {
  value = module.network.zone_id
}

output "zone_name" {
  value = module.network.zone_name
}

output "private_subnet_ids" {
  value = module.network.private_subnet_ids
}

output "metrics_security_group_id" {
  value = module.network.metrics_security_group_id
}

output "internal_security_group_id" {
  value = module.network.internal_security_group_id
}

output "peer" {
  description = "What a peering with another region needs."
  value = {
    region         = var.region
    vpc_id         = module.network.vpc_id
    cidr           = module.network.cidr
    route_table_id = module.network.private_route_table_id
    zone_id        = module.network.zone_id
  }
}

output "edge_listener_protocol" {
  value = module.edge.listener_protocol
}

output "kms_key_arn" {
  description = "The key this region's certificate bundles are encrypted with."
  value       = aws_kms_key.secrets.arn
}
