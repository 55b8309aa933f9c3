output "bootstrap_brokers" {
  description = "Empty when Kafka is off."
  value       = var.enabled ? aws_msk_cluster.this[0].bootstrap_brokers : ""
}
