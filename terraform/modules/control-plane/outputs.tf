output "configs" {
  value     = module.config[*].toml
  sensitive = true
}
