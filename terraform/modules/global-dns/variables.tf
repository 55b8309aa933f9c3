variable "name" {
  description = "The client-facing host name (under domain)."
  type        = string
  default     = "im"
}

variable "domain" {
  type = string
}

variable "zone_id" {
  description = "An existing public zone for domain; empty creates one."
  type        = string
  default     = ""
}

variable "edges" {
  description = "Per AWS region: its edge's load balancer name and port."
  type        = map(object({ dns_name = string, port = number }))
  validation {
    condition     = length(var.edges) > 0
    error_message = "name at least one region's edge."
  }
}
