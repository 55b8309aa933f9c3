output "endpoints" {
  value = [for h in local.hosts : "http://${h}:${var.client_port}"]
}
