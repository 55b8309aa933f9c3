output "node_ids" {
  description = "The replicas created in this region."
  value       = [for id in keys(local.here) : tonumber(id)]
}

output "configs" {
  description = "Rendered router.toml per node id."
  value       = { for id, c in module.config : id => c.toml }
  sensitive   = true
}
