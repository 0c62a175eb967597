{{/*
Labels Helm adds to every object's metadata beside deploy/'s own; the drift
check (deploy/chart_test.go) ignores exactly these two. Never in selectors
or pod templates: a selector cannot change on upgrade.
*/}}
{{- define "bulkhead.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* An object's labels: its component (when it has one), part-of and Helm's. */}}
{{- define "bulkhead.labels" -}}
{{ with .name }}app.kubernetes.io/name: {{ . }}
{{ end -}}
app.kubernetes.io/part-of: bulkhead
{{ include "bulkhead.helmLabels" .root }}
{{- end -}}

{{/* An image reference: repository@digest, else repository:tag (tag empty: appVersion). */}}
{{- define "bulkhead.image" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* imagePullPolicy, when one is set. */}}
{{- define "bulkhead.pullPolicy" -}}
{{ with .Values.images.pullPolicy }}imagePullPolicy: {{ . }}{{ end }}
{{- end -}}

{{/* A TOML array of strings. */}}
{{- define "bulkhead.tomlStrings" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s | quote }}{{ end }}]
{{- end -}}

{{/* The Service the API server dials. */}}
{{- define "bulkhead.webhookHost" -}}
bulkhead-webhook.{{ .Values.namespace }}.svc
{{- end -}}

{{/* Whether to render the Prometheus Operator's objects of kind .kind. */}}
{{- define "bulkhead.operatorObjects" -}}
{{- $m := .root.Values.monitoring -}}
{{- if and $m.enabled (or (eq $m.prometheusOperator "always") (and (eq $m.prometheusOperator "auto") (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)))) -}}
true
{{- end -}}
{{- end -}}
