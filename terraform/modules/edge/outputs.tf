output "lb_dns_name" {
  value = aws_lb.this.dns_name
}

output "lb_zone_id" {
  value = aws_lb.this.zone_id
}

output "port" {
  value = var.port
}

output "config" {
  value     = local.config
  sensitive = true
}

output "listener_protocol" {
  description = "TLS when the load balancer terminates client TLS, TCP when the edges do."
  value       = aws_lb_listener.this.protocol
}
