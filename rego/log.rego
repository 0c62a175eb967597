# METADATA
# description: |
#   Decision-log masks (OPA's data.system.log.mask convention): JSON pointers
#   into the logged event whose values are erased. Bulkhead also masks
#   container environment values and secret-looking annotations itself.
package system.log

# kubectl copies the whole object, environment included, into this annotation.
mask contains "/input/pod/annotations/kubectl.kubernetes.io~1last-applied-configuration" if {
	input.input.pod.annotations["kubectl.kubernetes.io/last-applied-configuration"]
}

# Pod labels are free text written by the author; keep their keys only.
mask contains {"op": "upsert", "path": sprintf("/input/pod/labels/%s", [escape(key)]), "value": "**masked**"} if {
	some key, _ in input.input.pod.labels
	regex.match(`(?i)(secret|token|password|passwd|credential)`, key)
}

escape(key) := replace(replace(key, "~", "~0"), "/", "~1")
