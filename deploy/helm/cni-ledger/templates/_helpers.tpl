{{/*
The name of every object: cni-ledger, whatever the release's name. One agent per node
is the point; a second release in the same namespace fails on these names instead of
starting a second agent that would fight the first for the conflist.
*/}}
{{- define "cni-ledger.name" -}}
cni-ledger
{{- end -}}

{{/* The namespace: namespaceOverride, else the release's (helm install -n). */}}
{{- define "cni-ledger.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The selector's label, fixed (a DaemonSet's selector cannot change). */}}
{{- define "cni-ledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cni-ledger.name" . }}
{{- end -}}

{{/* Every object's labels: the selector's and commonLabels. */}}
{{- define "cni-ledger.labels" -}}
{{ include "cni-ledger.selectorLabels" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The service account the pod runs as; empty: the namespace's default. */}}
{{- define "cni-ledger.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cni-ledger.name" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "cni-ledger.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}
