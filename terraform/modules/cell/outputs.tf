output "cell_id" {
  value = "${var.region}/${var.name}"
}

output "endpoint" {
  value = "http://${local.host}:${var.port}"
}

output "config" {
  description = "The rendered cell.toml."
  value       = local.config
  sensitive   = true
}
